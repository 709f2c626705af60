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
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.helpers.cli import REPO, podrace_command, podrace_env
from tests.waiting import wait_until

ROOT = REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict:
    """The environment of a process of the run: each forces its own device count."""
    return podrace_env(device_count=False, JAX_PLATFORMS="cpu")


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


SMALL_FLAGS = (
    "--layout.actors-per-device",
    "1",
    "--env.num-envs",
    "8",
    "--rollout-length",
    "16",
    "--network.hidden-sizes",
    "16",
    "--ppo.num-minibatches",
    "2",
    "--eval.episodes",
    "2",
    "--eval.num-envs",
    "2",
    "--log.interval-s",
    "0.2",
)
"""A small CartPole run in each process: 1 actor x 8 envs x 16 steps, 2-episode evaluations."""
SMALL_SPU = 2 * 1 * 8 * 16
"""Env steps per update of SMALL_FLAGS' run: processes x actors x envs x rollout length."""


def podrace_train(process: int, port: int, *flags: str, processes: int = 2) -> list[str]:
    """`podrace train cartpole-ppo` as process `process` of `processes`, the coordinator on
    this machine at `port`, with `flags`."""
    return podrace_command(
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
    )


def wait_for_metrics(path: Path, procs, lines: int = 2, timeout: float = 150) -> None:
    """Until `path` (a process's metrics.jsonl) has `lines` lines, while `procs` live."""
    wait_until(
        lambda: path.exists() and path.read_text().count("\n") >= lines,
        timeout,
        lambda: "training never started",
        while_alive=procs,
    )


def service_child(pid: int) -> int | None:
    """The pid of `pid`'s coordination-service child (process 0, during and after
    jax.distributed.initialize), if it has one yet."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()
            cmdline = open(f"/proc/{entry}/cmdline", "rb").read()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid and b"coordination_service" in cmdline:
            return int(entry)
    return None


def both_processes(port: int, *flags: str) -> list[list[str]]:
    """The commands of processes 0 and 1 of a two-process `podrace train ... flags`."""
    return [podrace_train(p, port, *flags) for p in range(2)]


def worker_commands(port: int, *args: str, after: Sequence[str] = ()) -> list[list[str]]:
    """The commands of processes 0 and 1 of tests/runtime/multihost_worker.py: `args`, the
    process id, the process count and the coordinator at `port`, then `after`."""
    return [
        [
            sys.executable,
            "-m",
            "tests.runtime.multihost_worker",
            *args,
            str(p),
            "2",
            f"127.0.0.1:{port}",
            *after,
        ]
        for p in range(2)
    ]


def last_line_starting(err: str, prefix: str = "podrace:") -> str:
    """The last line of a process's stderr `err` that starts with `prefix`."""
    return [line for line in err.splitlines() if line.startswith(prefix)][-1]
