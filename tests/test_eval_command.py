"""`podrace eval`: loads a checkpoint, plays fresh episodes, writes JSON and a video."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from PIL import Image

from podrace.checkpoint import Checkpointer, RunState, checkpoint_dir
from podrace.config import ConfigError
from podrace.envs import env_spec, make_env
from podrace.eval_command import EvalOptions, evaluate_run, play_episodes
from podrace.types import EnvSpec, EnvStep
from tests.test_checkpoint import fresh_state, tiny_config

REPO = Path(__file__).resolve().parents[1]


def always_right(state: RunState) -> RunState:
    """Params whose most likely action is 1 (push right) in every state."""
    params = jax.tree.map(np.asarray, state.train_state.params)
    head = params["params"]["policy_head"]
    head["kernel"] = np.zeros_like(head["kernel"])
    head["bias"] = np.asarray([0.0, 5.0], np.float32)
    return dataclasses.replace(state, train_state=state.train_state._replace(params=params))


def make_run(run_dir: Path, state_fn=lambda s: s) -> Path:
    cfg = tiny_config()
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg)))
    checkpointer = Checkpointer(checkpoint_dir(run_dir), cfg, env_spec(cfg.env))
    try:
        checkpointer.save(state_fn(fresh_state(cfg, version=3)))
    finally:
        checkpointer.close()
    return run_dir


@pytest.mark.timeout(120)
def test_eval_plays_the_checkpoint_policy_and_writes_json_without_overwriting(tmp_path):
    run = make_run(tmp_path / "run", always_right)
    result = evaluate_run(EvalOptions(run, episodes=6, seed=4))

    written = json.loads((run / "eval-3.json").read_text())
    assert written["checkpoint"] == 3 and written["episodes"] == 6 and written["policy"] == "deterministic"
    returns = np.asarray(written["returns"])
    assert written["return"] == pytest.approx(
        {"mean": returns.mean(), "std": returns.std(), "min": returns.min(), "max": returns.max()})
    assert set(written["length"]) == {"mean", "std", "min", "max"} and len(written["lengths"]) == 6

    # The same envs driven by "always push right" give exactly these episodes.
    env = make_env(tiny_config().env, 6, 4)
    expected, _ = play_episodes(env, lambda obs: np.ones(len(obs), np.int32), 6)
    env.close()
    assert written["returns"] == expected.tolist()

    again = evaluate_run(EvalOptions(run, episodes=6, seed=4))
    assert again["output"] == str(run / "eval-3-2.json")
    assert json.loads((run / "eval-3.json").read_text()) == written
    assert result["output"] == str(run / "eval-3.json")


class FixedLengthEnv:
    """Env i ends an episode every lengths[i] steps, with return = its length."""

    def __init__(self, lengths):
        self.lengths = np.asarray(lengths)
        self.num_envs = len(lengths)
        self.spec = EnvSpec((1,), np.dtype(np.float32), 2, ())
        self.t = np.zeros(self.num_envs, int)

    def reset(self):
        return np.zeros((self.num_envs, 1), np.float32)

    def step(self, actions):
        self.t += 1
        done = self.t % self.lengths == 0
        zeros = np.zeros(self.num_envs)
        return EnvStep(self.reset(), zeros, done, done & False, done, self.lengths.astype(float), self.lengths)

    def close(self):
        pass


@pytest.mark.timeout(30)
def test_every_env_plays_its_share_so_short_episodes_are_not_over_counted():
    returns, lengths = play_episodes(FixedLengthEnv([1, 10]), lambda obs: np.zeros(len(obs), int), 4)
    assert sorted(lengths.tolist()) == [1, 1, 10, 10]
    assert returns.mean() == 5.5


@pytest.mark.timeout(120)
def test_video_gif_of_one_episode_and_mp4_without_ffmpeg_is_a_clear_error(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", always_right)
    result = evaluate_run(EvalOptions(run, episodes=1, video=tmp_path / "episode.gif"))
    gif = Image.open(tmp_path / "episode.gif")
    assert gif.format == "GIF" and gif.size == (600, 400)
    assert gif.n_frames == result["video_frames"] == result["lengths"][0] + 1  # reset frame + one per step

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="MP4 needs ffmpeg"):
        evaluate_run(EvalOptions(run, episodes=1, video=tmp_path / "episode.mp4"))


@pytest.mark.timeout(60)
def test_errors_come_before_anything_is_written(tmp_path):
    empty = tmp_path / "empty-run"
    empty.mkdir()
    with pytest.raises(ConfigError, match="no checkpoint in"):
        evaluate_run(EvalOptions(empty))
    run = make_run(tmp_path / "run")
    existing = tmp_path / "results.json"
    existing.write_text("keep me")
    with pytest.raises(ConfigError, match="already exists"):
        evaluate_run(EvalOptions(run, output=existing))
    with pytest.raises(ConfigError, match="must be positive"):
        evaluate_run(EvalOptions(run, episodes=0))
    assert existing.read_text() == "keep me"
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.json"]


@pytest.mark.timeout(180)
def test_cli_eval_prints_statistics_and_exits_2_on_errors(tmp_path):
    run = make_run(tmp_path / "run")
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", "podrace.cli", "eval", str(run), "--episodes", "2"]
    ok = subprocess.run(command, capture_output=True, text=True, env=env, timeout=150)
    assert ok.returncode == 0, ok.stderr
    assert "return  mean" in ok.stdout and "results: " in ok.stdout
    assert (run / "eval-3.json").exists()

    bad = subprocess.run(command + ["--checkpoint", "7"], capture_output=True, text=True, env=env, timeout=150)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        f"podrace: error: no checkpoint for step 7 in {run / 'checkpoints'} (saved: 3)"
    ]
