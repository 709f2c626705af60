"""Processes of a multi-host run on this machine, for tests: ports, commands, cleanup.

Every process is started in its own process group, which `processes` kills on the way
out, so a failing test leaves nothing behind.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from tests.xla_flags import without_device_count

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict:
    out = without_device_count(os.environ)  # each process forces its own device count
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), out.get("PYTHONPATH")]))
    out["JAX_PLATFORMS"] = "cpu"
    return out


@contextmanager
def processes(commands: list[list[str]], **kwargs):
    procs = []
    try:
        for command in commands:
            procs.append(
                subprocess.Popen(
                    command,
                    cwd=ROOT,
                    env=env(),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                    **kwargs,
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
        sys.executable,
        "-m",
        "podrace.cli",
        "train",
        "cartpole-ppo",
        "--distributed.coordinator",
        f"127.0.0.1:{port}",
        "--distributed.num-processes",
        str(processes),
        "--distributed.process-id",
        str(process),
        "--distributed.init-timeout-s",
        "60",
        "--log.console",
        "none",
        *flags,
    ]
