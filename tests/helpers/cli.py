"""The `podrace` command from tests: in this process (`run_cli`) or in a subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from podrace.cli import main
from tests.xla_flags import without_device_count

REPO = Path(__file__).resolve().parents[2]
EXIT_SLACK_S = 5.0
"""How long a stopped `podrace` may take to exit: 2 s is the target, the rest is slack for a
loaded machine."""

TWO_DEVICE_FLAGS = (
    "--log.console",
    "none",
    "--log.interval-s",
    "0.2",
    "--eval.episodes",
    "2",
    "--eval.num-envs",
    "2",
    "--layout.cpu-devices",
    "2",
    "--layout.actor-device-ids",
    "1",
)
"""Flags of a quiet `podrace train` with 2-episode evaluations, its actor on CPU device 1 of
2: start it without the suite's device count (`device_count=False`), as the CLI sets it
from the config (a resumed one too) before JAX starts a backend."""


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`podrace ARGS` in this process: its exit code, stdout and stderr."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def podrace_command(*args: str, script: str | None = None) -> list[str]:
    """The command line of `podrace ARGS` in this interpreter; with `script`, that Python code
    (`python -c`, with ARGS in sys.argv[1:]) runs in its place, to patch something first."""
    if script is not None:
        return [sys.executable, "-c", script, *args]
    return [sys.executable, "-m", "podrace.cli", *args]


def podrace_env(*, device_count: bool = True, **more: str) -> dict[str, str]:
    """This process's environment with this checkout first on PYTHONPATH, and `more`. Without
    `device_count`, the suite's forced CPU device count goes: for a process that sets its own
    (a multi-process run, a resumed run whose config names its devices)."""
    env = dict(os.environ) if device_count else without_device_count(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return {**env, **more}


def start_podrace(
    *args: str, script: str | None = None, device_count: bool = True, **popen: Any
) -> subprocess.Popen:
    """`podrace ARGS` started in a subprocess, stdout and stderr piped as text unless `popen`
    says otherwise (it overrides any argument of subprocess.Popen)."""
    options: dict[str, Any] = {
        "stdout": subprocess.PIPE,
        "stderr": subprocess.PIPE,
        "text": True,
        "env": podrace_env(device_count=device_count),
        **popen,
    }
    return subprocess.Popen(podrace_command(*args, script=script), **options)


def run_python(
    *args: str, timeout: float, device_count: bool = True, **run: Any
) -> subprocess.CompletedProcess:
    """`python ARGS` (a script, `-c CODE`, `-m MODULE`) in this interpreter with this checkout
    on PYTHONPATH (`podrace_env`), run to its end within `timeout` seconds, its output
    captured as text unless `run` says otherwise (it overrides any argument of
    subprocess.run)."""
    options: dict[str, Any] = {"env": podrace_env(device_count=device_count), "text": True, **run}
    if "stdout" not in run and "stderr" not in run:
        options.setdefault("capture_output", True)
    return subprocess.run([sys.executable, *args], timeout=timeout, **options)


def run_podrace(
    *args: str, timeout: float, script: str | None = None, device_count: bool = True, **run: Any
) -> subprocess.CompletedProcess:
    """`podrace ARGS` run to its end as `run_python` runs a script."""
    command = podrace_command(*args, script=script)[1:]
    return run_python(*command, timeout=timeout, device_count=device_count, **run)


ENDLESS = 100_000_000
"""Env steps no test's run reaches: the test stops it."""


def run_flags(tmp_path: Path, total_steps: int | None = None, name: str = "r") -> tuple[str, ...]:
    """The flags of a `podrace train` whose run is `tmp_path/name`, `total_steps` long (by
    default the preset's)."""
    steps = () if total_steps is None else ("--total-steps", str(total_steps))
    return ("--log.run-dir", str(tmp_path), "--log.run-name", name, *steps)


def start_two_device_train(tmp_path: Path, *flags: str) -> subprocess.Popen:
    """An endless `podrace train cartpole-ppo` of run `tmp_path/r` with TWO_DEVICE_FLAGS and
    `flags`, started from the checkout without the suite's device count."""
    return start_podrace(
        "train",
        "cartpole-ppo",
        *run_flags(tmp_path, ENDLESS),
        *flags,
        *TWO_DEVICE_FLAGS,
        device_count=False,
        cwd=REPO,
    )


def start_train(
    tmp_path: Path, *flags: str, console: str = "none", interval_s: float = 0.2, **popen: Any
) -> subprocess.Popen:
    """`podrace train cartpole-ppo` started as `start_podrace` does, its run `tmp_path/r`,
    `console` its console mode, a metrics line every `interval_s`, and `flags`."""
    return start_podrace(
        "train",
        "cartpole-ppo",
        *run_flags(tmp_path),
        "--log.console",
        console,
        "--log.interval-s",
        str(interval_s),
        *flags,
        **popen,
    )


@contextmanager
def group_killed_at_the_end(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """Yields `proc` (started with `start_new_session=True`); on the way out, kills its
    process group with SIGKILL if it still runs, and reaps it: a failing test leaves
    nothing behind."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
