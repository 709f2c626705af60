"""`--pbt.*` values that cannot run: one line, exit 2, nothing written; population 1 is no PBT."""

import dataclasses
import json

import pytest

from podrace.config import ConfigError, replace
from podrace.presets import PRESETS
from podrace.validation import validate
from tests.helpers.cli import run_cli

GOOD = ["--pbt.population", "4", "--eval.every-updates", "5", "--pbt.interval-steps", "10000"]


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--pbt.population", "0"], "pbt.population must be in [1, 256], got 0"),
        (["--pbt.interval-steps", "10"], "pbt.interval_steps must be at least one update's"),
        (["--pbt.bottom-fraction", "0.75"], "pbt.bottom_fraction must be in (0, 0.5]"),
        (["--pbt.perturb-factors", "0.8", "-1.2"], "pbt.perturb_factors must be positive"),
        (["--pbt.resample-probability", "1.5"], "pbt.resample_probability must be in [0, 1]"),
        (["--pbt.mutate", "num_epochs"], "pbt.mutate must name ppo hyperparameters"),
        (["--pbt.mutate", "gamma", "gamma"], "pbt.mutate must name ppo hyperparameters"),
        (["--pbt.metric", " "], "pbt.metric must name a metric"),
        (["--pbt.metric", "bogus/metric"], "pbt.metric bogus/metric is not a metric"),
        (["--pbt.metric", "eval/retrun"], "pbt.metric eval/retrun is not a metric"),
        (["--pbt.metric", "return"], "pbt.metric return is not a metric"),
        (["--total-steps", "5000"], "pbt.interval_steps must be at most total_steps"),
        (["--pbt.metric", "info/x"], "ranks on a value the env reports in its info"),
        (["--eval.every-updates", "0"], "pbt.metric eval/return needs evaluations"),
        (["--ppo.learning-rate", "0.5"], "ppo.learning_rate must be in [1e-06, 0.01]"),
        (
            ["--runtime", "ray", "--layout.inference", "server", "--env.workers", "2"],
            "leave out --layout.inference server",
        ),
        (
            ["--runtime", "ray", "--ray.num-workers", "auto", "--ray.data-order", "elastic"]
            + ["--ray.rollouts-per-update", "2"],
            "needs a number of workers per member: --ray.num-workers N (not auto)",
        ),
        (["--env.workers", "2"], "--pbt.population runs its members in one process (no --env"),
        (
            ["--distributed.num-processes", "2", "--distributed.process-id", "0"],
            "no --distributed.* yet",
        ),
        (["--seed", str(2**31 - 2)], "seed must be at most 2**31 - 4"),
    ],
)
def test_bad_pbt_config_is_one_line_and_exit_2(capsys, tmp_path, flags, message):
    code, _, err = run_cli(
        capsys, "train", "cartpole-ppo", "--log.run-dir", str(tmp_path), *GOOD, *flags
    )
    assert code == 2, err
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_population_one_ignores_the_other_pbt_settings():
    cfg = PRESETS["cartpole-ppo"][1]
    validate(replace(cfg, **{"pbt.bottom_fraction": 0.9, "pbt.mutate": ("nonsense",)}))
    with pytest.raises(ConfigError, match="pbt.bottom_fraction"):
        validate(
            replace(
                cfg, **{"pbt.population": 2, "pbt.bottom_fraction": 0.9, "eval.every_updates": 5}
            )
        )


def test_one_member_of_a_population_is_not_resumed_alone(capsys, tmp_path):
    member = tmp_path / "r" / "member-1"
    member.mkdir(parents=True)
    cfg = replace(PRESETS["cartpole-ppo"][1], **{"pbt.population": 2, "pbt.member": 1})
    (member / "config.json").write_text(json.dumps(dataclasses.asdict(cfg)))
    code, _, err = run_cli(capsys, "train", "--resume", str(member))
    assert code == 2, err
    assert "is member 1 of a population: resume the population's run directory" in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = run_cli(
        capsys, "train", "cartpole-ppo", "--log.run-dir", str(tmp_path / "new"), *GOOD,
        "--pbt.member", "0",
    )  # fmt: skip
    assert code == 2 and "pbt.member names member 0 of a population" in err
    assert not (tmp_path / "new").exists()
