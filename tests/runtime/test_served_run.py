"""Runs with env worker processes (`--env.workers`) and inference threads, in the thread
topology: what they learn, and the thread runtime's guarantees (stop, a killed worker,
Ctrl-C) with processes in the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from podrace.runtime.run import prepare
from tests.helpers.cli import (
    EXIT_SLACK_S,
    group_killed_at_the_end,
    podrace_env,
    run_podrace,
    start_train,
)
from tests.helpers.configs import small
from tests.helpers.runs import final_params, stop_after
from tests.waiting import wait_until

pytestmark = pytest.mark.slow  # each trains a run, most in a subprocess


def gym(tmp_path, **changes):
    return small(tmp_path, **{"env.backend": "gymnasium", "eval.episodes": 2, **changes})


@pytest.mark.timeout(300)
def test_deterministic_runs_learn_the_same_with_workers_or_without(tmp_path):
    """Deterministic mode: 2 actors with their envs in threads, and the same actors with
    their envs in 2 workers each and an inference thread per actor, end with bit-identical
    params; a run whose actors share one inference server ends the same twice."""
    base = {"deterministic": True, "total_steps": 8 * 2 * 16 * 6}
    threads, _, _ = final_params(gym(tmp_path, **base, **{"log.run_name": "t"}))
    workers, result, run = final_params(
        gym(tmp_path, **base, **{"log.run_name": "w", "env.workers": 2})
    )
    assert result.updates == 6
    for a, b in zip(jax.tree.leaves(threads), jax.tree.leaves(workers)):
        np.testing.assert_array_equal(a, b)
    served = {"env.workers": 2, "layout.inference": "server"}
    one, _, _ = final_params(gym(tmp_path, **base, **served, **{"log.run_name": "s1"}))
    two, _, _ = final_params(gym(tmp_path, **base, **served, **{"log.run_name": "s2"}))
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(two)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.timeout(300)
def test_a_stopped_served_run_resumes_to_its_end_consuming_every_rollout_once(tmp_path):
    """Two actors behind one server: consumed in order, lag within the bound, server metrics
    in the lines. A stop (as by SIGTERM) mid-run ends it within seconds with its last state
    saved and its worker processes gone; the resumed run starts new workers at the
    checkpoint's next seqs: across both parts every (actor, seq) is consumed exactly once."""
    from podrace.checkpoints.resume import Resume

    cfg = gym(
        tmp_path,
        **{"env.workers": 2, "layout.inference": "server", "log.run_name": "r"},
        **{"inference.max_wait_ms": 1.0},
    )
    run = prepare(cfg)
    stopped = []

    def note_the_workers() -> None:
        pids = [w.process.pid for ws in run.fleet.workers.values() for w in ws]
        stopped.append((time.monotonic(), pids))

    stop_after(run, 5, "SIGTERM received", first=note_the_workers)
    first = run.run()
    elapsed = time.monotonic() - stopped[0][0]
    assert (first.updates, first.checkpoint) == (5, 5)
    assert elapsed <= EXIT_SLACK_S, elapsed
    assert run.pipeline.consumed.stamps() == [(a, 0, s) for s in range(5) for a in range(2)]
    assert first.max_policy_lag <= 1
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert any("server/batch_envs" in line for line in lines)
    assert lines[-1]["env/worker_restarts"] == 0
    wait_until(lambda: not any(alive(p) for p in stopped[0][1]), 10)

    resumed = prepare(None, resume=Resume(tmp_path / "r"))
    second = resumed.run()
    assert (second.updates, second.checkpoint) == (cfg.num_updates, cfg.num_updates) == (12, 12)
    both = [(a, s) for a, _, s in run.pipeline.consumed.stamps()]
    both += [(a, s) for a, _, s in resumed.pipeline.consumed.stamps()]
    assert sorted(both) == [(a, s) for a in range(2) for s in range(12)]


def start(tmp_path, *flags) -> subprocess.Popen:
    return start_train(
        tmp_path,
        "--env.backend",
        "gymnasium",
        "--env.workers",
        "2",
        *flags,
        console="lines",
        start_new_session=True,  # its own process group: Ctrl-C is sent to the group
    )


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            pass
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def training(proc, metrics: Path, steps: int = 1, timeout: float = 120) -> dict:
    """Wait for a metrics line with at least `steps` env steps; return it."""
    found = {}

    def ok() -> bool:
        assert proc.poll() is None, proc.communicate()
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        if lines and json.loads(lines[-1]).get("env_steps", 0) >= steps:
            found.update(json.loads(lines[-1]))
            return True
        return False

    wait_until(ok, timeout)
    return found


@pytest.mark.timeout(240)
@pytest.mark.parametrize("inference", ["actor", "server"])
def test_ctrl_c_stops_within_seconds_and_leaves_no_worker(tmp_path, inference):
    """SIGINT to the whole process group (a terminal's Ctrl-C reaches the workers too):
    exit 130 within seconds, a final line, no traceback, and every worker process gone.
    (A stop that comes during a slow batched call: tests/inference/test_server.py.)"""
    with group_killed_at_the_end(
        start(tmp_path, "--total-steps", "100000000", "--layout.inference", inference)
    ) as proc:
        metrics = tmp_path / "r" / "metrics.jsonl"
        training(proc, metrics, steps=512)
        workers = children(proc.pid)
        assert len(workers) == 2, workers
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        elapsed = time.monotonic() - sent
        assert proc.returncode == 130, err
        assert "Traceback" not in err, err
        assert json.loads(metrics.read_text().splitlines()[-1])["final"] == 1
        assert elapsed <= EXIT_SLACK_S, (elapsed, err)
        wait_until(lambda: not any(alive(w) for w in workers), 10)


@pytest.mark.timeout(240)
def test_a_sigkilled_env_worker_is_restarted_and_the_run_finishes(tmp_path):
    with group_killed_at_the_end(start(tmp_path, "--total-steps", "60000")) as proc:
        metrics = tmp_path / "r" / "metrics.jsonl"
        training(proc, metrics, steps=2048)
        first = children(proc.pid)
        os.kill(first[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        last = json.loads(metrics.read_text().splitlines()[-1])
        assert last["env/worker_restarts"] == 1
        assert out.startswith("done: 59,904 env steps"), out
    kept = len(metrics.read_text().splitlines())
    resumed = run_podrace(
        "train",
        "--resume",
        str(tmp_path / "r"),
        "--total-steps",
        "65000",
        "--log.console",
        "none",
        timeout=120,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = [json.loads(x) for x in metrics.read_text().splitlines()[kept:]]
    assert after and all(line["env/worker_restarts"] == 1 for line in after)  # counts on


@pytest.mark.timeout(240)
def test_a_killed_env_worker_past_its_restarts_fails_the_run_in_one_line(tmp_path):
    with group_killed_at_the_end(
        start(tmp_path, "--total-steps", "100000000", "--env.worker-restarts", "0")
    ) as proc:
        training(proc, tmp_path / "r" / "metrics.jsonl", steps=512)
        workers = children(proc.pid)
        os.kill(workers[1], signal.SIGKILL)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=60)
        assert time.monotonic() - sent <= EXIT_SLACK_S
        assert proc.returncode == 1, err
        assert "Traceback" not in err, err
        assert err.strip().splitlines()[-1] == (
            f"podrace: error: actor-0.inference failed: EnvWorkerDied: env worker actor-0.w1 "
            f"(pid {workers[1]}) was killed by SIGKILL; restarts are off "
            "(env.worker_restarts 0)"
        ), err
        wait_until(lambda: not any(alive(w) for w in workers), 10)


@pytest.mark.timeout(240)
def test_a_factory_of_the_script_run_as_main_reaches_the_workers(tmp_path):
    """A library caller's factory defined in its script (`__main__`, which a worker process
    cannot import) travels by value; the run trains with it in the workers."""
    script = tmp_path / "train_mine.py"
    script.write_text(
        "import dataclasses, gymnasium, podrace\n"
        "def make(num_envs, seed):\n"
        "    return gymnasium.make_vec('CartPole-v1', num_envs, vectorization_mode='sync')\n"
        "cfg = podrace.presets.get('cartpole-ppo')\n"
        "cfg = podrace.config.replace(cfg, **{'env.workers': 2, 'env.num_envs': 8,\n"
        "    'total_steps': 8 * 8 * 4, 'log.run_dir': 'runs', 'log.console': 'none',\n"
        "    'eval.episodes': 1, 'eval.num_envs': 1})\n"
        "if __name__ == '__main__':\n"
        "    print('updates', podrace.train(cfg, env_factory=make).updates)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=podrace_env(),
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "updates 4"
