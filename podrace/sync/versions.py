"""Bookkeeping shared by publishers: version numbering and lazily derived, shared copies.

A published version keeps the learner's params by reference; whatever is derived from it
(the transformed tree, a copy placed on a device, a host copy for shared memory) is
computed once, by the first thread that needs it, and shared by everyone after.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

from podrace.sync.base import PyTree, SyncError


class Once:
    """Computes one value once; concurrent callers wait for the first caller's result.

    A compute that raises is not cached: the next caller tries again.
    """

    __slots__ = ("_lock", "_value", "_done")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value: Any = None
        self._done = False

    def get(self, compute: Callable[[], Any]) -> Any:
        if self._done:
            return self._value
        with self._lock:
            if not self._done:
                self._value = compute()
                self._done = True
        return self._value


class Published:
    """One published version: the raw params plus derived values keyed by purpose."""

    def __init__(self, version: int, raw: PyTree) -> None:
        self.version = version
        self.raw = raw
        self._lock = threading.Lock()
        self._derived: dict[Any, Once] = {}

    def derived(self, key: Any, compute: Callable[[], Any]) -> Any:
        """The value for `key`, computing it with `compute()` if nobody has yet."""
        with self._lock:
            slot = self._derived.get(key)
            if slot is None:
                slot = self._derived[key] = Once()
        return slot.get(compute)


class VersionCounter:
    """Assigns versions: `first_version`, then +1, or an explicit, strictly newer one."""

    def __init__(self, first_version: int = 0) -> None:
        self._next = first_version
        self.latest: int | None = None

    def next(self, explicit: int | None = None) -> int:
        """Claim the next version (callers serialize; publish holds its lock)."""
        if explicit is None:
            version = self._next
        elif self.latest is not None and explicit <= self.latest:
            raise SyncError(f"publish(version={explicit}) is not newer than latest {self.latest}")
        else:
            version = int(explicit)
        self.latest, self._next = version, version + 1
        return version


class _Reaper:
    """Drops references on a background thread.

    Evicting an old version can free hundreds of MB (its placed copies); doing that inside
    `publish` would make the learner pay for it, so evicted versions are handed here.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def release(self, obj: Any) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="podrace-sync-reaper", daemon=True)
                    self._thread.start()
        self._queue.put(obj)

    def _run(self) -> None:
        while True:
            obj = self._queue.get()
            del obj  # the last reference: memory is freed on this thread


_reaper = _Reaper()


def release_later(obj: Any) -> None:
    """Free `obj` (once the caller has dropped its own references) off the caller's thread."""
    _reaper.release(obj)
