"""Env-only Ray workers served from the learner's host (`--runtime ray --layout.inference
server`): the thread topology's served run with Ray actors for env workers. Each test
starts its own private local Ray and leaves no process of it behind."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from podrace.config import replace
from podrace.presets import PRESETS
from podrace.runtime.run import prepare
from tests.waiting import wait_until

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.filterwarnings("ignore:os.fork", "ignore::UserWarning")


def small(tmp_path, **changes):
    base = {
        "total_steps": 8 * 2 * 16 * 6,
        "rollout_length": 16,
        "env.num_envs": 8,
        "env.backend": "gymnasium",
        "env.workers": 1,
        "layout.inference": "server",
        "ppo.num_minibatches": 4,
        "eval.every_updates": 0,
        "eval.episodes": 2,
        "eval.num_envs": 2,
        "log.console": "none",
        "log.run_dir": str(tmp_path),
        "log.interval_s": 0.5,
    }
    base.update(changes)
    return replace(PRESETS["cartpole-ppo"][1], **base)


def final_params(cfg):
    run = prepare(cfg)
    result = run.run()
    return jax.device_get(run.learner.state.params), result, run


@pytest.mark.timeout(420)
def test_ray_env_workers_learn_exactly_what_env_processes_do(tmp_path):
    """Deterministic mode: 2 actors whose envs step in one Ray worker each, served on this
    process's device, end with the params of the same run with env worker processes."""
    det = {"deterministic": True}
    ray_params, result, run = final_params(
        small(tmp_path, runtime="ray", **{"ray.num_workers": 2, "log.run_name": "ray"}, **det)
    )
    assert result.topology == "ray" and result.updates == 6
    assert run.pipeline.consumed.stamps() == [(a, 0, s) for s in range(6) for a in range(2)]
    local, _, _ = final_params(
        small(tmp_path, **{"layout.actors_per_device": 2, "log.run_name": "threads"}, **det)
    )
    for a, b in zip(jax.tree.leaves(ray_params), jax.tree.leaves(local)):
        np.testing.assert_array_equal(a, b)
    assert not ray.is_initialized()


@pytest.mark.timeout(420)
def test_a_killed_ray_env_worker_is_restarted(tmp_path):
    cfg = small(
        tmp_path,
        runtime="ray",
        total_steps=8 * 2 * 16 * 40,
        **{"ray.num_workers": 2, "log.run_name": "kill"},
    )
    run = prepare(cfg)
    killed = []

    def kill_one_when_training():
        wait_until(lambda: run.learner.version >= 3 or run.lifetime.stopping, 200)
        link = run.topology.served.workers[1][0]
        killed.append(link.pid)
        link.kill()

    import threading

    killer = threading.Thread(target=kill_one_when_training, daemon=True)
    killer.start()
    result = run.run()
    killer.join(10)
    assert killed and result.updates == 40
    assert sum(s.restarts for s in run.topology.served.servers) == 1
    stamps = run.pipeline.consumed.stamps()
    assert stamps == [(a, 0, s) for s in range(40) for a in range(2)]
