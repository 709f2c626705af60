"""`local` transport: learner and actors are threads of one process.

A snapshot is a reference to the learner's (non-donated) arrays. `publish` is bookkeeping
only: the transform and each device placement run lazily, once per version (and device),
in whichever consumer thread asks first; every other subscriber on that device shares the
result. Old versions beyond `keep` are dropped, releasing their references.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import jax

from podrace.sync.base import (
    ChannelClosed,
    PublisherGone,
    PyTree,
    Snapshot,
    Subscriber,
    SyncTimeout,
    wait_limit,
)
from podrace.sync.placement import Placement, place, placement_name
from podrace.sync.publisher_base import VersionedPublisher, check_keep
from podrace.sync.spec import TreeSpec
from podrace.sync.stats import RunningStat, tree_nbytes
from podrace.sync.versions import Published, TransformStage, release_later


class LocalPublisher(VersionedPublisher):
    """In-process publisher; see the module docstring.

    Args:
      transform: applied once per version on the publisher side (select a sub-tree, cast).
      keep: how many recent versions the publisher keeps referenced (>= 1).
      first_version: version of the first publish.
    """

    def __init__(
        self,
        transform: Callable[[PyTree], PyTree] | None = None,
        keep: int = 2,
        first_version: int = 0,
    ) -> None:
        stage = TransformStage(transform, "local", finish=self._count_bytes)
        super().__init__(stage, first_version)
        self._keep = check_keep(keep)
        self._entries: deque[Published] = deque()
        self._error: str | None = None
        self._subscribers: weakref.WeakValueDictionary[str, LocalSubscriber] = (
            weakref.WeakValueDictionary()
        )
        self._names = itertools.count()
        self._place_time: dict[str, RunningStat] = {}
        self._stat_lock = threading.Lock()

    # -- learner side ---------------------------------------------------------------
    def _accept(self, entry: Published, start: float) -> None:
        if len(self._entries) == self._keep:
            release_later(self._entries.popleft())  # freeing its copies is not our cost
        self._entries.append(entry)
        self._cond.notify_all()

    def _newest(self) -> Published | None:
        return self._entries[-1] if self._entries else None

    def subscribe(
        self, device: Placement = None, *, expect: Any = None, name: str | None = None
    ) -> LocalSubscriber:
        """A subscriber whose snapshots are placed on `device` (a Device or Sharding).

        `expect` (a params-like pytree or TreeSpec) makes every snapshot checked against it.
        """
        with self._cond:
            self._check_open("subscribe")
            name = name or f"sub{next(self._names)}"
            if name in self._subscribers:
                raise ValueError(f"subscriber name {name!r} is already in use")
            sub = LocalSubscriber(
                self, device, None if expect is None else TreeSpec.of(expect), name
            )
            self._subscribers[name] = sub
            return sub

    def close(self, error: str | None = None) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._error = error
            self._entries.clear()
            for subscriber in self._subscribers.values():
                subscriber._last = None  # nothing more to return: every reference goes
            self._cond.notify_all()
        self._push.close()

    def _channel_metrics(self) -> dict[str, float | int]:
        latest = self.latest_version
        out: dict[str, float | int] = {"versions_alive": len(self._entries)}
        with self._stat_lock:
            for where, stat in self._place_time.items():
                out.update(stat.report(f"place/{where}/seconds"))
        for name, sub in list(self._subscribers.items()):
            acked = sub.acked_version
            out[f"subscriber/{name}/acked_version"] = -1 if acked is None else acked
            out[f"subscriber/{name}/lag"] = 0 if latest is None or acked is None else latest - acked
        return out

    # -- consumer side (called from subscriber threads) --------------------------------
    def _closed_error(self, what: str) -> ChannelClosed:
        if self._error is not None:
            return PublisherGone(f"local publisher failed ({what}): {self._error}")
        return ChannelClosed(f"publisher closed ({what})")

    def _newest_first(self) -> list[Published]:
        with self._cond:
            if self._closed:
                raise self._closed_error("reading the latest version")
            return list(reversed(self._entries))

    def _wait(self, min_version: int, timeout: float | None, sub: LocalSubscriber) -> int:
        """Block until a version >= min_version is published; return the latest version."""

        def ready() -> bool:
            return (
                self._closed
                or sub._closed
                or (bool(self._entries) and self._entries[-1].version >= min_version)
            )

        with self._cond:
            if not self._cond.wait_for(ready, timeout):
                latest = self._entries[-1].version if self._entries else None
                raise SyncTimeout(
                    f"subscriber {sub.name!r}: no version >= {min_version} within {timeout}s "
                    f"(latest is {latest})"
                )
            if self._closed:
                raise self._closed_error(f"while {sub.name!r} awaited version >= {min_version}")
            if sub._closed:
                raise ChannelClosed(f"subscriber {sub.name!r} is closed")
            return self._entries[-1].version

    def _unsubscribe(self, sub: LocalSubscriber) -> None:
        """Forget a closed subscriber: no longer reported, and its name is free again (as
        on shm and ray, where a closed subscriber drops out of the metrics)."""
        with self._cond:
            if self._subscribers.get(sub.name) is sub:
                del self._subscribers[sub.name]
            self._cond.notify_all()  # wakes its blocked get()

    def _snapshot(self, entry: Published, where: Placement) -> Snapshot | None:
        """The snapshot of `entry` placed at `where`, computed once and shared; None if
        the version failed (its transform raised)."""
        host = self._stage.apply(entry)
        if host is None:
            return None
        if where is None:
            return host
        return entry.derived(where, lambda: self._place(host, where))

    def _count_bytes(self, params: PyTree) -> PyTree:
        self._bytes = tree_nbytes(params)
        return params

    def _place(self, host: Snapshot, where: Placement) -> Snapshot:
        start = time.perf_counter()
        placed = jax.block_until_ready(place(host.params, where))
        elapsed = time.perf_counter() - start
        key = placement_name(where)
        with self._stat_lock:
            stat = self._place_time.get(key)
            if stat is None:
                stat = self._place_time[key] = RunningStat()
        stat.add(elapsed)
        return Snapshot(host.version, placed)


class LocalSubscriber(Subscriber):
    """Reads a LocalPublisher; create with `publisher.subscribe(device)`."""

    def __init__(
        self, publisher: LocalPublisher, where: Placement, expect: TreeSpec | None, name: str
    ):
        self._pub = publisher
        self._where = where
        self._expect = expect
        self.name = name
        self._lock = threading.Lock()
        self._acked: int | None = None
        self._last: Snapshot | None = None
        """The snapshot last returned: `get` returns it again when it still satisfies the
        call and nothing newer can be delivered (the publisher may have dropped its version)."""
        self._closed = False

    def poll(self) -> Snapshot | None:
        self._check_open()
        with self._lock:
            return self._newest(-1 if self._acked is None else self._acked + 1)

    def get(self, min_version: int, timeout: float | None = None) -> Snapshot:
        self._check_open()
        timeout = wait_limit(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        want = min_version
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            latest = self._pub._wait(want, remaining, self)
            with self._lock:
                snapshot = self._newest(min_version)
                if (
                    snapshot is None
                    and self._last is not None
                    and self._last.version >= min_version
                ):
                    snapshot = self._last
            if snapshot is not None:
                return snapshot
            want = latest + 1  # every version >= min_version failed: wait for a newer one

    def _newest(self, min_version: int) -> Snapshot | None:
        """The newest deliverable snapshot of version >= min_version (failed ones skipped)."""
        for entry in self._pub._newest_first():
            if entry.version < min_version:
                return None
            snapshot = self._pub._snapshot(entry, self._where)
            if snapshot is not None:
                if self._expect is not None:
                    self._expect.check(
                        snapshot.params, f"version {snapshot.version} for {self.name!r}"
                    )
                self._acked = snapshot.version
                self._last = snapshot
                return snapshot
        return None

    def _check_open(self) -> None:
        if self._closed:
            raise ChannelClosed(f"subscriber {self.name!r} is closed")

    @property
    def acked_version(self) -> int | None:
        return self._acked

    def close(self) -> None:
        self._closed = True
        self._last = None
        self._pub._unsubscribe(self)
