"""A recurrent preset through the commands: train, resume from a checkpoint (the resumed
run's actors restart their cores from the initial state, as their envs restart), evaluate."""

from __future__ import annotations

import json

import pytest

from podrace.cli import main
from podrace.presets import PRESETS
from podrace.validation import validate

FLAGS = [
    "--log.console",
    "none",
    "--eval.episodes",
    "2",
    "--eval.num-envs",
    "2",
    "--env.num-envs",
    "8",
    "--network.core-size",
    "8",
    "--ppo.num-minibatches",
    "2",
]
STEPS = 8 * 16  # env steps per update of cartpole-po-ppo-lstm with 8 envs (T = 16)


def test_the_partially_observed_presets_differ_only_by_the_core():
    recurrent, feed_forward = (
        PRESETS[name][1] for name in ("cartpole-po-ppo-lstm", "cartpole-po-ppo")
    )
    assert recurrent.network.core == "lstm" and feed_forward.network.core == "none"
    assert recurrent.env.obs_indices == feed_forward.env.obs_indices == (0, 2)
    same = {**feed_forward.__dict__, "name": recurrent.name, "network": recurrent.network}
    assert same == recurrent.__dict__
    assert PRESETS["atari-impala-lstm"][1].network.core == "lstm"
    for name in ("cartpole-po-ppo-lstm", "cartpole-po-ppo", "atari-impala-lstm"):
        validate(PRESETS[name][1])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_resume_and_evaluate_a_recurrent_run(capsys, tmp_path):
    run_dir = tmp_path / "runs" / "lstm"
    common = [*FLAGS, "--log.run-dir", str(tmp_path / "runs")]
    code = main(
        ["train", "cartpole-po-ppo-lstm", *common, "--log.run-name", "lstm"]
        + ["--total-steps", str(4 * STEPS), "--checkpoint.every-updates", "2"]
    )
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    code = main(["train", "--resume", str(run_dir), "--total-steps", str(6 * STEPS)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads((run_dir / "config.json").read_text())["network"]["core"] == "lstm"
    code = main(["eval", str(run_dir), "--episodes", "3", "-o", str(tmp_path / "eval.json")])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["checkpoint"] == 6 and result["episodes"] == 3
    assert all(r >= 1 for r in result["returns"])


@pytest.mark.timeout(60)
def test_a_resumed_run_cannot_change_its_core(capsys, tmp_path):
    code = main(
        ["train", "cartpole-po-ppo-lstm", *FLAGS, "--log.run-dir", str(tmp_path)]
        + ["--log.run-name", "r", "--total-steps", str(2 * STEPS)]
    )
    assert code == 0
    capsys.readouterr()
    code = main(["train", "--resume", str(tmp_path / "r"), "--network.core", "gru"])
    err = capsys.readouterr().err
    assert code == 2 and "--resume cannot change network.core" in err
