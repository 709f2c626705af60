"""Lines to stderr that never block for long: from signal handlers, or just before a
process leaves with os._exit (a run whose peer was lost, a second Ctrl-C)."""

from __future__ import annotations

import os
import select

STDERR_WAIT_S = 1.0
"""How long a write to stderr waits for a reader that stopped reading (a full pipe: `2>&1 |
less` not scrolled) before the line is dropped."""


def fd_takes_writes(fd: int | None) -> bool:
    """False where `fd` is a pipe its reader has left full for STDERR_WAIT_S (a write would
    block until the reader reads: a signal's exit with it)."""
    if fd is None:
        return True
    try:
        return bool(select.select([], [fd], [], STDERR_WAIT_S)[1])
    except (OSError, ValueError):  # closed: the write itself fails, and is dropped
        return True


def write_stderr_now(text: str) -> None:
    """`text` straight to fd 2 (from a signal handler, or just before os._exit); nothing
    where stderr cannot take it, or not within STDERR_WAIT_S."""
    try:
        if fd_takes_writes(2):
            os.write(2, text.encode())
    except OSError:
        pass


__all__ = ["STDERR_WAIT_S", "fd_takes_writes", "write_stderr_now"]
