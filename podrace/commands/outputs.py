"""The output files of `podrace eval` and `podrace plot`: checked before the work starts,
written whole (a temporary file, then a rename), with a signal deferred meanwhile."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from podrace.commands.supervisor import signals_deferred
from podrace.config import ConfigError
from podrace.rundir import shown


def check_writable(path: Path) -> None:
    """ConfigError unless a file can be written at `path` the way podrace writes files (a
    temporary file next to it, then renamed over it): `path` is not a directory and its
    directory takes a new file. Checked by creating and removing such a file, which also
    catches what permission bits do not say (a read-only file system, root squash, ACLs, a
    name too long). Leaves nothing behind; says nothing about free space."""
    path = Path(path)
    parent = path.absolute().parent
    with signals_deferred():  # `podrace eval`/`plot`: a signal leaves no probe file behind
        try:
            if path.is_dir():
                raise ConfigError(f"cannot write {shown(path)}: it is a directory")
            if not parent.is_dir():
                raise ConfigError(f"cannot write {shown(path)}: {shown(parent)} is not a directory")
            fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
        except OSError as error:
            raise ConfigError(f"cannot write {shown(path)}: {error.strerror or error}") from None
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)


__all__ = ["check_writable"]
