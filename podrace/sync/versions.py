"""Bookkeeping shared by publishers: version numbering and lazily derived, shared copies.

A published version keeps the learner's params by reference; whatever is derived from it
(the transformed tree, a copy placed on a device, a host copy for shared memory) is
computed once, by the first thread that needs it, and shared by everyone after.
"""

from __future__ import annotations

import collections
import logging
import operator
import threading
import time
from collections.abc import Callable
from typing import Any

from podrace.sync.base import PyTree, Snapshot, SyncError
from podrace.sync.stats import RunningStat

_log = logging.getLogger(__name__)


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
    """Assigns versions: `first_version`, then +1, or an explicit, strictly newer one.

    Versions are integers in 0..MAX_VERSION on every transport (shm packs them into a word
    with its slot, readers use -1 for "none yet"), so anything else is rejected here, before
    anything is published (a version the transport could not carry would fail the channel).
    """

    def __init__(self, first_version: int = 0) -> None:
        first_version = _as_version(first_version, "first_version")
        self._next = first_version
        self.latest: int | None = None

    def next(self, explicit: int | None = None) -> int:
        """Claim the next version (callers serialize; publish holds its lock)."""
        if explicit is None:
            version = self._next
            if version > MAX_VERSION:
                raise ValueError(
                    f"versions must be <= {MAX_VERSION}: the channel is out of versions"
                )
        else:
            version = _as_version(explicit, "publish(version)")  # 3.5 must not become 3
            if self.latest is not None and version <= self.latest:
                raise SyncError(
                    f"publish(version={version}) is not newer than latest {self.latest}"
                )
        self.latest, self._next = version, version + 1
        return version


MAX_VERSION = 2**55 - 1  # shm stores (version << 8) | slot in a signed 64-bit word


def _as_version(value: object, what: str) -> int:
    """`value` as a version: an integer (Python, NumPy or 0-d JAX) in 0..MAX_VERSION."""
    try:
        version = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"versions are integers, got {_show(what, value)}") from None
    if version < 0:
        raise ValueError(f"versions must be >= 0, got {_show(what, version)}")
    if version > MAX_VERSION:
        raise ValueError(f"versions must be <= {MAX_VERSION}, got {_show(what, version)}")
    return version


def _show(what: str, value: object) -> str:
    return f"publish(version={value!r})" if what == "publish(version)" else f"{what}={value!r}"


class TransformStage:
    """Turns a published version into what consumers get, once: transform, then `finish`.

    A failure fails that version only: the outcome (None) is kept with the version, so the
    transform is not retried and every consumer skips it alike; it is counted and logged,
    and later versions are unaffected.
    """

    def __init__(
        self,
        transform: Callable[[PyTree], PyTree] | None,
        label: str,
        finish: Callable[[PyTree], PyTree] = lambda params: params,
    ) -> None:
        self._transform = transform
        self._finish = finish
        self._label = label
        self._lock = threading.Lock()
        self._time = RunningStat()
        self.failures = 0
        self.last_failed_version = -1

    def apply(self, entry: Published) -> Snapshot | None:
        """The consumers' snapshot of `entry`, or None if preparing it failed."""
        return entry.derived("host", lambda: self._compute(entry))

    def _compute(self, entry: Published) -> Snapshot | None:
        params, entry.raw = entry.raw, None  # what consumers need is derived from here on
        try:
            if self._transform is not None:
                start = time.perf_counter()
                params = self._transform(params)
                self._time.add(time.perf_counter() - start)
            params = self._finish(params)
        except Exception as exc:  # noqa: BLE001 - fails this version only; counted, logged
            with self._lock:
                self.failures += 1
                self.last_failed_version = max(self.last_failed_version, entry.version)
            _log.error(
                "%s: transform of version %d failed; version skipped",
                self._label,
                entry.version,
                exc_info=exc,
            )
            return None
        return Snapshot(entry.version, params)

    def metrics(self) -> dict[str, float | int]:
        with self._lock:
            out: dict[str, float | int] = {
                "transform/failures": self.failures,
                "transform/last_failed_version": self.last_failed_version,
            }
        out.update(self._time.report("transform/seconds"))
        return out


class _Reaper:
    """Drops references on a background thread.

    Evicting an old version can free hundreds of MB (its placed copies); doing that inside
    `publish` would make the learner pay for it, so evicted versions are handed here. The
    thread lingers `LINGER_S` for more, then ends (a new one starts with the next release);
    `finish` ends it at once, so a finished run leaves no thread in the caller's process.
    """

    LINGER_S = 1.0

    def __init__(self) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._finishing = 0

    def release(self, obj: Any) -> None:
        with self._cond:
            self._items.append(obj)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="podrace-sync-reaper", daemon=True
                )
                self._thread.start()
            else:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._items and not self._finishing:
                    self._cond.wait(self.LINGER_S)
                if not self._items:
                    self._thread = None
                    return
                obj = self._items.popleft()
            del obj  # the last reference: memory is freed on this thread

    def finish(self) -> None:
        """Free what is queued and end the thread (until the next release)."""
        with self._cond:
            thread = self._thread
            self._finishing += 1
            self._cond.notify_all()
        try:
            if thread is not None:
                thread.join()
        finally:
            with self._cond:
                self._finishing -= 1


_reaper = _Reaper()


def release_later(obj: Any) -> None:
    """Free `obj` (once the caller has dropped its own references) off the caller's thread."""
    _reaper.release(obj)


def finish_releases() -> None:
    """Free everything `release_later` was given and end its thread (a run is over)."""
    _reaper.finish()
