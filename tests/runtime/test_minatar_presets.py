"""The MinAtar presets run a few updates on every topology that builds envs in its own
processes: the actor thread, env worker processes (--env.workers 2) and Ray workers, each
registering the MinAtar ids itself; the planes reach the learner as uint8.

Each preset runs on actor threads; env workers and Ray workers each run one preset (which
preset makes no difference to where envs are built; tests/envs/test_minatar.py checks that
env workers register the ids themselves and step uint8 planes)."""

from __future__ import annotations

import numpy as np
import pytest

from podrace.config import replace
from podrace.presets import PRESETS
from podrace.runtime.run import prepare
from tests.helpers.runs import record_batches

pytest.importorskip("minatar")
pytestmark = pytest.mark.filterwarnings("ignore:os.fork", "ignore::UserWarning")

# Tiny sizes: 8 envs (4 per actor thread for IMPALA's two), 8 steps, 3 updates; a 20-step
# time limit ends every episode so that returns are reported. The algorithm settings are
# the presets' own (minibatches, epochs, unrolling, network).
TINY = {
    "rollout_length": 8,
    "env.max_episode_steps": 20,
    "eval.every_updates": 0,
    "eval.episodes": 2,
    "eval.num_envs": 2,
    "log.console": "none",
    "log.interval_s": 0.5,
}
ENVS = {"minatar-ppo": 8, "minatar-impala": 4}
LAYOUTS = {
    "threads": {},
    "env-workers": {"env.workers": 2},
    "ray": {"runtime": "ray", "ray.num_workers": 2},
}


def tiny(name: str, layout: str, tmp_path, **changes):
    cfg = PRESETS[name][1]
    num_envs = ENVS[name]
    actors = 2 if layout == "ray" else cfg.num_actors
    return replace(
        cfg,
        total_steps=actors * num_envs * 8 * 3,
        **{**TINY, **LAYOUTS[layout], "env.num_envs": num_envs, "log.run_dir": str(tmp_path)},
        **changes,
    )


def record_rollouts(run) -> list:
    """Every batch of rollouts the learner consumes."""
    return record_batches(run, lambda _, batch: batch)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "name,layout",
    [("minatar-impala", "threads"), ("minatar-ppo", "threads"), ("minatar-ppo", "env-workers")],
)
def test_minatar_preset_runs_on_threads_with_uint8_planes(tmp_path, name, layout):
    cfg = tiny(name, layout, tmp_path, **{"env.id": "MinAtar/SpaceInvaders-v1"})
    run = prepare(cfg)
    batches = record_rollouts(run)
    result = run.run()
    assert result.updates == cfg.num_updates == 3 and len(batches) == 3
    T, B = cfg.rollout_length, cfg.env.num_envs
    returns = []
    for batch in batches:
        for rollout in batch:
            obs = rollout.trajectory.obs
            assert obs.dtype == np.uint8 and obs.shape == (T, B, 10, 10, 6)
            assert set(np.unique(np.asarray(obs))) <= {0, 1}
            returns.extend(rollout.episode_returns.tolist())
    assert len(returns) >= cfg.num_actors * B  # every env reached the time limit
    assert result.final_eval is not None and np.isfinite(result.final_eval.mean_return)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["minatar-impala"])
def test_minatar_preset_runs_on_ray_workers(tmp_path, name):
    ray = pytest.importorskip("ray")
    cfg = tiny(name, "ray", tmp_path)
    result = prepare(cfg).run()
    assert result.updates == cfg.num_updates == 3
    assert "episode/return" in (result.run_dir / "metrics.jsonl").read_text()
    assert result.final_eval is not None and np.isfinite(result.final_eval.mean_return)
    assert not ray.is_initialized()
