"""One process writes a run directory at a time.

A run holds an exclusive `flock` on its run directory from before it writes anything there
until it has returned. Without it a `--resume` of a run that is still training (or two
resumes at once) both write the directory: one moves the other's metrics lines away,
checkpoints of two runs interleave, a half-written one can become the latest. The lock is
on the directory itself, so taking it writes nothing (a refused resume leaves the run as it
was, a read-only run can be locked); the kernel drops it when its holder exits in any way,
SIGKILL included, so a dead run never blocks a resume. An flock belongs to the open file,
which a fork child shares: a child (an env's helper process) that outlived a killed run
would hold it on. So fork children close their copy at once (the parent's lock stays).
"""

from __future__ import annotations

import fcntl
import os
import weakref
from pathlib import Path

from podrace.config import ConfigError


class RunLock:
    """The held lock of one run directory; `release()` (idempotent) lets the next run in."""

    def __init__(self, run_dir: Path):
        try:
            fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as error:
            raise ConfigError(f"cannot lock run directory {run_dir}: {error.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(
                f"run directory {run_dir} is in use by another podrace process "
                "(a run still writing it); stop that run first"
            ) from None
        self._fd: int | None = fd
        _held.add(self)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_held: weakref.WeakSet[RunLock] = weakref.WeakSet()


def _drop_inherited() -> None:
    for lock in list(_held):
        lock.release()  # closes the child's descriptor only: no LOCK_UN, the parent keeps it


os.register_at_fork(after_in_child=_drop_inherited)


__all__ = ["RunLock"]
