"""Several processes, one learner mesh (jax.distributed, gloo, forced CPU devices).

Every test starts its processes in their own process groups and kills the groups in
`finally`, so a failing test leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import jax
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict:
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), out.get("PYTHONPATH")]))
    out.pop("XLA_FLAGS", None)  # each process forces its own device count
    out["JAX_PLATFORMS"] = "cpu"
    return out


@contextmanager
def processes(commands: list[list[str]], **kwargs):
    procs = []
    try:
        for command in commands:
            procs.append(
                subprocess.Popen(
                    command, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    start_new_session=True, **kwargs,
                )
            )
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                stream.close()


def finish(procs, timeout: float) -> list[tuple[int, str, str]]:
    deadline = time.monotonic() + timeout
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        results.append((proc.returncode, out, err))
    return results


def podrace_train(process: int, port: int, *flags: str, processes: int = 2) -> list[str]:
    return [
        sys.executable, "-m", "podrace.cli", "train", "cartpole-ppo",
        "--distributed.coordinator", f"127.0.0.1:{port}",
        "--distributed.num-processes", str(processes),
        "--distributed.process-id", str(process),
        "--distributed.init-timeout-s", "60",
        "--log.console", "none",
        *flags,
    ]


@pytest.mark.timeout(240)
def test_two_processes_compute_the_updates_of_one_with_two_learner_devices(tmp_path):
    from tests.runtime import multihost_worker as worker

    port = free_port()
    out = str(tmp_path / "params")
    commands = [
        [sys.executable, "-m", "tests.runtime.multihost_worker", out, str(p), "2", f"127.0.0.1:{port}"]
        for p in range(2)
    ]
    with processes(commands) as procs:
        results = finish(procs, 200)
    for code, _, err in results:
        assert code == 0, err[-3000:]
    reference = jax.tree.leaves(worker.train(jax.devices()[:2], 1, 0))
    for p in range(2):
        got = np.load(f"{out}.{p}.npz")
        assert len(got.files) == len(reference)
        for i, ref in enumerate(reference):
            np.testing.assert_allclose(got[str(i)], ref, rtol=1e-4, atol=1e-5)
    initial = jax.tree.leaves(
        worker.make_network(worker.config(1).network, worker.env_spec(worker.config(1).env)).init(
            jax.random.PRNGKey(0), np.zeros((1, 4), np.float32)
        )
    )
    assert max(float(np.abs(np.asarray(a) - b).max()) for a, b in zip(initial, reference)) > 0
