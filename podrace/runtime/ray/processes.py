"""The processes of a private local Ray on this machine: find them, wait for them to end,
stop them, and sweep away the local Rays of runs whose owner is gone.

A local Ray that podrace starts lives in a temp dir of its own (`TEMP_PREFIX`), with a
record of the process that owns it; its processes are found by that dir (on their command
line, or a file open inside it) and by descent from those. Processes are named by
{pid: start time}, so a reused pid is never mistaken for one of them. Only this user's
processes are ever touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time

TEMP_PREFIX = "podrace-ray-"
_OWNER = "owner"


def write_owner(temp_dir: str) -> None:
    """Record which process owns this local Ray (pid and start time, so a reused pid is
    not mistaken for the owner)."""
    st = _stat(os.getpid())
    with open(os.path.join(temp_dir, _OWNER), "w") as f:
        f.write(f"{os.getpid()} {st[1] if st else 0}\n")


def _owner_alive(temp_dir: str) -> bool | None:
    """Whether the process that started the local Ray in `temp_dir` still runs (None: no
    readable owner record, e.g. the owner is still writing it)."""
    try:
        with open(os.path.join(temp_dir, _OWNER)) as f:
            pid, start = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        return None
    return bool(alive({pid: start}))


def sweep_orphans() -> list[str]:
    """Stop and remove the local Rays of podrace runs whose owner is gone (a driver killed
    with SIGKILL cannot stop its Ray: its daemons and workers would run on, holding CPUs
    and memory). Only this user's `podrace-ray-*` temp dirs with a dead owner are touched;
    returns the dirs removed."""
    removed = []
    root = tempfile.gettempdir()
    for name in sorted(os.listdir(root)):
        temp_dir = os.path.join(root, name)
        if not name.startswith(TEMP_PREFIX) or _owner_alive(temp_dir) is not False:
            continue
        with contextlib.suppress(OSError):
            if os.stat(temp_dir).st_uid != os.getuid():
                continue
        processes = process_tree(temp_dir)
        for pid in alive(processes):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        reap(processes, grace_s=5.0)
        shutil.rmtree(temp_dir, ignore_errors=True)
        removed.append(temp_dir)
    return removed


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, start time, uid) of `pid`, None if it is gone (or a zombie: it has exited, and
    a container's init may never reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            return None
        return int(fields[1]), int(fields[19]), os.stat(f"/proc/{pid}").st_uid
    except (OSError, IndexError, ValueError):
        return None


def process_tree(temp_dir: str) -> dict[int, int]:
    """{pid: start time} of this user's processes that use `temp_dir` (a local Ray's
    daemons and agents, see `_uses`) and of all their descendants (its workers, which
    rename themselves `ray::...`)."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None and st[2] == os.getuid():
            stats[int(entry)] = st
    roots = {pid for pid in stats if pid != os.getpid() and _uses(pid, temp_dir)}
    tree, frontier = set(roots), set(roots)
    while frontier:
        frontier = {pid for pid, st in stats.items() if st[0] in frontier and pid not in tree}
        tree |= frontier
    return {pid: stats[pid][1] for pid in tree}


def _uses(pid: int, temp_dir: str) -> bool:
    """`temp_dir` is on the command line of `pid` or it has a file open inside it (Ray's
    agents rename themselves `ray::...` but keep their logs there, and outlive a killed
    raylet as orphans)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        if not _is_ray(cmdline, temp_dir):
            return False  # a user's `tail -f` of its logs, a script given the path: not Ray's
        if temp_dir.encode() in cmdline:
            return True
        inside = temp_dir.rstrip("/") + "/"
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(inside):
                    return True
    except OSError:  # the process ended while we looked
        pass
    return False


def _is_ray(cmdline: bytes, temp_dir: str) -> bool:
    """A Ray process by its command line: `ray` in an argument other than the ones naming
    `temp_dir` (raylet, gcs_server and Ray's Python scripts live under a `ray/` folder,
    workers and agents rename themselves `ray::...`)."""
    path = temp_dir.rstrip("/").encode()
    return any(b"ray" in arg for arg in cmdline.split(b"\0") if path not in arg)


def alive(processes: dict[int, int]) -> list[int]:
    """The pids of `processes` ({pid: start time}) still running (pid reuse excluded)."""
    return [
        pid for pid, start in processes.items() if (st := _stat(pid)) is not None and st[1] == start
    ]


def reap(processes: dict[int, int], grace_s: float = 10.0) -> None:
    """Wait for `processes` to exit, then SIGKILL the stragglers.

    `ray.shutdown()` stops a local Ray already; this makes "nothing left running" a
    guarantee. Only the processes of this run's private local Ray are touched.
    """
    deadline = time.monotonic() + grace_s
    while (left := alive(processes)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def stop_ray(temp_dir: str, grace_s: float = 10.0) -> list[int]:
    """Stop the Ray whose `--temp-dir` is `temp_dir` on this machine: this user's processes
    that use it and their children, SIGTERM then (after `grace_s`) SIGKILL; returns their
    pids. Other Rays of the machine are never touched (Ray 2.60's `ray stop` stops all)."""
    processes = process_tree(os.path.abspath(temp_dir))
    for pid in alive(processes):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    reap(processes, grace_s=grace_s)
    deadline = time.monotonic() + 5.0  # those just SIGKILLed take a moment to go
    while alive(processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    return sorted(processes)
