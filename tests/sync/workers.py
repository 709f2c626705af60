"""Functions run in child processes by the sync tests (importable, no pytest needed)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np


def stamped_params(version: int, n: int) -> dict[str, np.ndarray]:
    """Every element of `x` is the version; `sum` is a checksum over the whole tree."""
    x = np.full((n,), version, dtype=np.int64)
    return {
        "x": x,
        "w": np.arange(4, dtype=np.float32) + version,
        "sum": np.array(x.sum() + 4 * version),
    }


def stamp_of(params: Any) -> int | None:
    """The version a snapshot encodes, or None if its parts disagree (a torn read)."""
    x = np.asarray(params["x"])
    v = int(x[0])
    if not (x == v).all():
        return None
    if not np.array_equal(np.asarray(params["w"]), np.arange(4, dtype=np.float32) + v):
        return None
    if int(np.asarray(params["sum"])) != int(x.sum()) + 4 * v:
        return None
    return v


def read_until(sub: Any, final: int, stall: float) -> dict[str, int]:
    """Read `sub` (poll, then get when idle) until `final`; count torn reads and regressions.

    Gives up (SyncTimeout) only when no newer version arrives for `stall` seconds: a
    loaded machine publishes slowly, and the total time is the caller's timeout.
    """
    from podrace.sync.base import ChannelClosed

    last, seen, torn, regressions = -1, 0, 0, 0
    try:
        while last < final:
            snap = sub.poll()
            if snap is None:
                snap = sub.get(last + 1, timeout=stall)
            v = stamp_of(snap.params)
            if v is None or v != snap.version:
                torn += 1
                continue
            if v <= last:
                regressions += 1
            last, seen = max(last, v), seen + 1
    except ChannelClosed:
        pass
    return {"last": last, "seen": seen, "torn": torn, "regressions": regressions}


def shm_reader(channel: str, final: int, ready: Any, results: Any) -> None:
    from podrace.sync.shm_subscriber import ShmSubscriber

    sub = ShmSubscriber(channel)
    ready.set()
    out = read_until(sub, final, stall=60)
    out["retries"] = int(sub.metrics()["torn_read_retries"])
    sub.close()
    results.put(out)


def pickled_reader(sub: Any, min_version: int, results: Any) -> None:
    """Use a subscriber that was pickled in the parent."""
    snap = sub.get(min_version, timeout=30)
    results.put((snap.version, stamp_of(snap.params)))
    sub.close()


def shm_publisher_then_hang(names: Any) -> None:
    from podrace.sync.shm import ShmPublisher

    pub = ShmPublisher()
    pub.publish(stamped_params(0, 8))
    names.put(pub.name)
    time.sleep(600)  # killed by the test


def read_remote(sub: Any, min_version: int) -> tuple[int, int | None, int]:
    """Body of a Ray task: read once through a pickled subscriber."""
    import os

    snap = sub.get(min_version, timeout=30)
    sub.close()
    return snap.version, stamp_of(snap.params), os.getpid()


def shm_ack_then_hang(channel: str, name: str, ready: Any) -> None:
    from podrace.sync.shm_subscriber import ShmSubscriber

    sub = ShmSubscriber(channel, name=name)  # referenced: a dropped subscriber releases itself
    sub.get(0, timeout=30)
    ready.set()
    time.sleep(600)  # killed by the test


def forked_reader(sub: Any, results: Any) -> None:
    """Use a subscriber inherited through a fork (a copy of the parent's, not pickled)."""
    sub.poll()  # its first use attaches this copy (the parent then sees it in its metrics)
    snap = sub.get(1, timeout=30)
    results.put((snap.version, stamp_of(snap.params)))
    sub.close()


def close_inherited(sub: Any) -> None:
    """Close a subscriber inherited through a fork, as a child that is done with it does."""
    sub.close()


def use_inherited_publisher(pub, results) -> None:
    """In a fork child: publish, flush and close the parent's publisher; report what each did."""
    outcomes = []
    for call in (lambda: pub.publish(stamped_params(9, 8)), lambda: pub.flush(5), pub.close):
        try:
            call()
            outcomes.append("ok")
        except Exception as error:  # noqa: BLE001 - reported to the test
            outcomes.append(f"{type(error).__name__}: {error}")
    results.put(outcomes)
