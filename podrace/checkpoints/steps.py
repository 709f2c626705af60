"""A run's checkpoints folder on disk: the steps it holds, the names of steps being written
or deleted, and a reader's hold on a step.

A complete step is a directory named by its version (`<version>/`); a step being written is
`<version>.partial`, one being deleted `<version>.deleting` (see
`podrace.checkpoints.files`). A reader (`podrace eval` of a live run) holds a step with a
shared `step_lock`; the writer's rotation deletes a step only under the exclusive one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

from podrace.config import ConfigError

FORMAT = 1
"""The version of podrace's checkpoint layout (a step's meta and its manifest say it)."""
PARTIAL, DELETING = ".partial", ".deleting"
"""Suffixes of a step being written and of one being deleted: never read as checkpoints."""
_LEFTOVER = re.compile(
    r"[0-9]+(\.partial(\.orbax-checkpoint-tmp(-[0-9]+)?)?|\.deleting|\.orbax-checkpoint-tmp(-[0-9]+)?)"
)
"""The names a write or deletion killed halfway leaves (the last: orbax's, of older podrace)."""


def checkpoint_steps(directory: Path) -> list[int]:
    """Steps of the complete checkpoints in `directory`, ascending (temp dirs excluded)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(
        int(p.name) for p in directory.iterdir() if p.is_dir() and re.fullmatch(r"[0-9]+", p.name)
    )


def latest_step(directory: Path) -> int | None:
    steps = checkpoint_steps(directory)
    return steps[-1] if steps else None


def resolve_step(directory: Path, step: int | None = None) -> int:
    """`step`, or the latest one; ConfigError when there is no such checkpoint."""
    steps = checkpoint_steps(directory)
    if not steps:
        raise ConfigError(f"no checkpoint in {directory}")
    if step is None:
        return steps[-1]
    if step not in steps:
        raise ConfigError(
            f"no checkpoint for step {step} in {directory} (saved: {', '.join(map(str, steps))})"
        )
    return step


def leftovers(directory: Path) -> list[Path]:
    """What writes and deletions killed halfway left in `directory` (for the next writer to
    clear). ConfigError for a file or link of such a name: podrace would write or delete
    there; a resume checks this before it changes anything in the run."""
    found = []
    for path in sorted(directory.iterdir()) if directory.is_dir() else ():
        if not _LEFTOVER.fullmatch(path.name):
            continue
        if path.is_symlink() or not path.is_dir():
            raise ConfigError(
                f"{path} is in the way of podrace's checkpoints (a step is written as "
                f"<step>{PARTIAL} and deleted as <step>{DELETING}); move it out of {directory}"
            )
        found.append(path)
    return found


READ_HOLD_WAIT_S = 10.0
"""How long a reader waits for a step a rotation holds (it is being deleted: a moment)."""


@contextlib.contextmanager
def step_lock(step_dir: Path, shared: bool) -> Iterator[bool]:
    """An flock on a step's directory: a reader holds it shared while it reads, the writer's
    rotation takes it exclusively and deletes the step only with it. Yields whether it is
    held. Exclusive: tried once (False while a reader holds the step, so it is spared).
    Shared: retried for up to READ_HOLD_WAIT_S (a rotation is deleting the step, or a fork
    child of the writer kept its descriptor), then the read goes ahead unheld; a step that
    is gone yields False. A step that cannot be opened, or a file system without flock,
    holds neither side back."""
    try:
        fd = os.open(step_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        yield False
        return
    except OSError:  # not a directory, not readable: no reader holds it (reading it fails)
        yield not shared  # the rotation tries to delete it, and warns if it cannot
        return
    try:
        held, deadline = False, time.monotonic() + READ_HOLD_WAIT_S
        while True:
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                held = True
            except BlockingIOError:
                if shared and time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
            except OSError:  # no flock on this file system: rotate as if no one reads
                held = not shared
            break
        yield held
    finally:
        os.close(fd)  # releases the lock


__all__ = [
    "DELETING",
    "FORMAT",
    "PARTIAL",
    "checkpoint_steps",
    "latest_step",
    "leftovers",
    "resolve_step",
    "step_lock",
]
