"""Remove the shared-memory segments of `shm` publishers that died without cleaning up.

A publisher unlinks its segments on `close()`, and Python's resource tracker does it if the
publisher's process dies alone. Both are skipped when the process dies with its tracker (a
SIGKILL of its process group, an OOM kill of the job) or when the publisher ran in a
multiprocessing child: the segments then stay in /dev/shm until reboot.

A channel is swept only when two independent signs say its writer is dead: the writer PID
stored in its control segment is gone (or a zombie), and nobody listens on its doorbell
socket. Every `ShmPublisher` sweeps when it starts; to sweep by hand:

    python -m podrace.sync.shm_sweep [--dry-run]

Linux only (elsewhere there is no /dev/shm to list, and nothing is done).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket

import numpy as np

from podrace.sync.doorbell import socket_address
from podrace.sync.shm_layout import CTL_BYTES, MAGIC, W_MAGIC, W_WRITER_PID

SHM_DIR = "/dev/shm"
_DEFAULT_DATA_NAME = re.compile(r"podrace_(\d+)_[0-9a-f]+_d")


def sweep_shm(dry_run: bool = False) -> list[str]:
    """Unlink (unless `dry_run`) the segments of dead publishers; return their names."""
    try:
        names = set(os.listdir(SHM_DIR))
    except OSError:  # no /dev/shm (not Linux): nothing can be listed, nothing is swept
        return []
    doomed: list[str] = []
    for name in sorted(names):
        pid = _writer_pid(name)
        if pid is not None and _dead(pid, name):
            doomed += [seg for seg in (name + "_d", name) if seg in names]
    for name in sorted(names):  # data left without its control segment (default names only)
        match = _DEFAULT_DATA_NAME.fullmatch(name)
        if match and name[:-2] not in names and _dead(int(match.group(1)), name[:-2]):
            doomed.append(name)
    if dry_run:
        return doomed
    removed = []
    for seg in doomed:
        # gone already (another sweeper was faster) or not ours to remove: not reported
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(SHM_DIR, seg))
            removed.append(seg)
    return removed


def _writer_pid(name: str) -> int | None:
    """The writer PID of an initialized podrace control segment, else None."""
    path = os.path.join(SHM_DIR, name)
    try:
        if os.stat(path).st_size != CTL_BYTES:
            return None
        with open(path, "rb") as f:
            head = f.read(8 * (W_WRITER_PID + 1))
    except OSError:  # vanished, or not ours to read: leave it alone
        return None
    if len(head) < 8 * (W_WRITER_PID + 1):
        return None
    words = np.frombuffer(head, dtype=np.int64)
    return int(words[W_WRITER_PID]) if words[W_MAGIC] == MAGIC else None


def _dead(pid: int, channel: str) -> bool:
    return not _pid_alive(pid) and not _doorbell_listening(channel)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")  # a zombie has released everything it had


def _doorbell_listening(channel: str) -> bool:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(socket_address(channel))
    except OSError:
        return False
    finally:
        sock.close()
    return True
