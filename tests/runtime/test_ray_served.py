"""Env-only Ray workers served from the learner's host (`--runtime ray --layout.inference
server`): the thread topology's served run with Ray actors for env workers. Each test
starts its own private local Ray and leaves no process of it behind."""

from __future__ import annotations

import os
import threading
import time

import jax
import numpy as np
import pytest

from podrace.control import ComponentError
from podrace.runtime.ray.driver import RayDriver
from podrace.runtime.run import prepare
from tests.helpers.cli import EXIT_SLACK_S
from tests.helpers.configs import SMALL_SPU, small
from tests.helpers.runs import final_params, stop_after
from tests.waiting import wait_until

ray = pytest.importorskip("ray")

pytestmark = [
    pytest.mark.slow,  # each starts a local Ray and trains
    pytest.mark.filterwarnings("ignore:os.fork", "ignore::UserWarning"),
]


def served(tmp_path, **changes):
    """`small` for 6 updates with one actor a device, whose envs step in an env worker
    (gymnasium) and whose actions an inference server picks."""
    base = {
        "total_steps": 6 * SMALL_SPU,
        "env.backend": "gymnasium",
        "env.workers": 1,
        "layout.inference": "server",
        "layout.actors_per_device": 1,
        "log.interval_s": 0.5,
    }
    return small(tmp_path, **{**base, **changes})


@pytest.mark.timeout(420)
def test_ray_env_workers_learn_exactly_what_env_processes_do(tmp_path):
    """Deterministic mode: 2 actors whose envs step in one Ray worker each, served on this
    process's device, end with the params of the same run with env worker processes."""
    det = {"deterministic": True}
    ray_params, result, run = final_params(
        served(tmp_path, runtime="ray", **{"ray.num_workers": 2, "log.run_name": "ray"}, **det)
    )
    assert result.topology == "ray" and result.updates == 6
    assert run.pipeline.consumed.stamps() == [(a, 0, s) for s in range(6) for a in range(2)]
    local, _, _ = final_params(
        served(tmp_path, **{"layout.actors_per_device": 2, "log.run_name": "threads"}, **det)
    )
    for a, b in zip(jax.tree.leaves(ray_params), jax.tree.leaves(local)):
        np.testing.assert_array_equal(a, b)
    assert not ray.is_initialized()


@pytest.mark.timeout(420)
def test_a_killed_ray_env_worker_is_restarted(tmp_path):
    cfg = served(
        tmp_path,
        runtime="ray",
        total_steps=8 * 2 * 16 * 40,
        **{"ray.num_workers": 2, "log.run_name": "kill"},
    )
    run = prepare(cfg)
    killed = []

    def kill_one_when_training():
        wait_until(lambda: run.learner.version >= 3 or run.lifetime.stopping, 200)
        link = run.fleet.workers[1][0]
        killed.append(link.pid)
        link.kill()

    killer = threading.Thread(target=kill_one_when_training, daemon=True)
    killer.start()
    result = run.run()
    killer.join(10)
    assert killed and result.updates == 40
    assert sum(s.restarts for s in run.fleet.servers) == 1
    stamps = run.pipeline.consumed.stamps()
    assert stamps == [(a, 0, s) for s in range(40) for a in range(2)]


def worker_pids(run) -> list[int]:
    return [w.pid for ws in run.fleet.workers.values() for w in ws if w.pid]


def gone(pids: list[int]) -> bool:
    return not any(os.path.exists(f"/proc/{p}") for p in pids)


@pytest.mark.timeout(420)
def test_a_ray_env_worker_killed_past_its_restarts_fails_the_run_naming_it(tmp_path):
    """Restarts off: the run fails with one line naming the dead worker, within the thread
    runtime's seconds, and leaves neither Ray nor a worker behind."""
    cfg = served(
        tmp_path,
        runtime="ray",
        total_steps=8 * 2 * 16 * 400,
        **{"ray.num_workers": 2, "env.worker_restarts": 0, "log.run_name": "dead"},
    )
    run = prepare(cfg)
    killed, pids = [], []

    def kill_one_when_training():
        wait_until(lambda: run.learner.version >= 2 or run.lifetime.stopping, 200)
        pids.extend(worker_pids(run))
        killed.append(time.monotonic())
        run.fleet.workers[1][0].kill()

    killer = threading.Thread(target=kill_one_when_training, daemon=True)
    killer.start()
    with pytest.raises(ComponentError) as caught:
        run.run()
    ended = time.monotonic()
    killer.join(10)
    message = str(caught.value)
    assert "\n" not in message, message
    assert "EnvWorkerDied: env worker actor-1.w0 (Ray actor, pid" in message, message
    assert message.endswith("restarts are off (env.worker_restarts 0)"), message
    assert ended - killed[0] <= EXIT_SLACK_S + RayDriver.stop_grace_s
    assert not ray.is_initialized()
    wait_until(lambda: gone(pids), 20)


@pytest.mark.timeout(420)
def test_a_stopped_ray_served_run_resumes_to_its_end_consuming_every_rollout_once(tmp_path):
    """A stop (as by SIGTERM) ends the run within seconds with its last state saved and no
    Ray env worker left; the resumed run serves new env workers from the checkpoint's next
    seqs: across both parts every (actor, seq) is consumed exactly once."""
    from podrace.checkpoints.resume import Resume

    cfg = served(tmp_path, runtime="ray", **{"ray.num_workers": 2, "log.run_name": "r"})
    run = prepare(cfg)
    stopped = []

    def note_the_workers() -> None:
        stopped.append((time.monotonic(), worker_pids(run)))

    stop_after(run, 3, "SIGTERM received", first=note_the_workers)
    first = run.run()
    elapsed = time.monotonic() - stopped[0][0]
    assert (first.updates, first.checkpoint) == (3, 3)
    assert elapsed <= EXIT_SLACK_S + RayDriver.stop_grace_s, elapsed
    assert not ray.is_initialized()
    wait_until(lambda: gone(stopped[0][1]), 20)

    resumed = prepare(None, resume=Resume(tmp_path / "r"))
    second = resumed.run()
    assert (second.updates, second.checkpoint) == (cfg.num_updates, cfg.num_updates) == (6, 6)
    both = [(a, s) for a, _, s in run.pipeline.consumed.stamps()]
    both += [(a, s) for a, _, s in resumed.pipeline.consumed.stamps()]
    assert sorted(both) == [(a, s) for a in range(2) for s in range(6)]
    assert not ray.is_initialized()
