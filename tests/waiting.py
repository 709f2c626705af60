"""Polling for a condition that another thread or process makes true, with a deadline.

Tests wait on something observable (a file, a metrics line, a marker a child writes, a pid
that goes away) instead of sleeping for a guessed time: a loaded machine then only makes a
test slower, never wrong. A test sleeps only to simulate work or a hang, or where a comment
says why no event can be waited on (and a loaded machine can only make it pass vacuously).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from typing import TypeVar

Process = subprocess.Popen | BaseProcess
T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    describe: Callable[[], object] | None = None,
    *,
    while_alive: Process | Sequence[Process] = (),
    interval: float = 0.005,
) -> T:
    """Return `predicate()`'s value once it is true; fail the test (showing `describe()`) if
    it is not within `timeout` s.

    With `while_alive` (a process or several), fail at once, showing the exit status (and
    the output where it was piped), if one of them exits before `predicate()` is true."""
    procs = [while_alive] if isinstance(while_alive, Process) else list(while_alive)
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        exited = [proc for proc in procs if _exit_status(proc) is not None]
        if exited:
            if value := predicate():  # made true on the way out
                return value
            raise AssertionError(
                _joined(f"{exited[0]} exited first: " + _output(exited[0]), describe)
            )
        if time.monotonic() >= deadline:
            raise AssertionError(_joined(f"condition not reached within {timeout}s", describe))
        time.sleep(interval)
    return value


def wait_for_exit(proc: Process, timeout: float = 10.0) -> int:
    """Return `proc`'s exit status once it has exited; fail the test after `timeout` s."""
    wait_until(lambda: _exit_status(proc) is not None, timeout, lambda: f"{proc} still runs")
    status = _exit_status(proc)
    assert status is not None
    return status


def calling(thread: threading.Thread, name: str) -> bool:
    """Whether `thread` is inside a call of a function named `name` (e.g. blocked in it)."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == name:
            return True
        frame = frame.f_back
    return False


def _exit_status(proc: Process) -> int | None:
    return proc.poll() if isinstance(proc, subprocess.Popen) else proc.exitcode


def _output(proc: Process) -> str:
    status = f"exit status {_exit_status(proc)}"
    if isinstance(proc, subprocess.Popen) and (proc.stdout or proc.stderr):
        try:
            out, err = proc.communicate(timeout=10)
        except (subprocess.TimeoutExpired, ValueError):  # a child of it holds a pipe open
            return status
        return f"{status}\nstdout: {_tail(out)}\nstderr: {_tail(err)}"
    return status


def _tail(text: str | bytes | None) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return (text or "")[-4000:]


def _joined(message: str, describe: Callable[[], object] | None) -> str:
    return f"{message}\n{describe()}" if describe is not None else message
