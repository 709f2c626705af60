"""Push targets: consumers that never ask (inference servers, evaluators, relays).

Each target gets its own thread and a one-slot mailbox. `publish` only drops the newest
item into every mailbox, so a slow target skips to the latest version instead of queueing,
and a slow or failing one never delays the learner or the other targets.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from podrace.sync.base import ErrorHook, PushTarget, Snapshot
from podrace.sync.stats import RunningStat

_log = logging.getLogger(__name__)

Resolve = Callable[[Any], Snapshot | None]


class Mailbox:
    """A one-slot mailbox under its owner's condition (held by every caller): `put` leaves
    the newest item, replacing one not yet taken; `take` waits for it."""

    def __init__(self, cond: threading.Condition) -> None:
        self._cond = cond
        self.item: Any = None

    def put(self, item: Any) -> bool:
        """Leave `item` and wake the taker; returns whether it replaced an item not taken."""
        replaced = self.item is not None
        self.item = item
        self._cond.notify_all()
        return replaced

    def take(self, closed: Callable[[], bool]) -> Any:
        """Wait for an item and take it (the slot empties); None once `closed()`."""
        while self.item is None and not closed():
            self._cond.wait()
        if closed():
            return None
        item, self.item = self.item, None
        return item


class _PushWorker:
    """Delivers the newest offered item to one target, in version order, on its own thread."""

    def __init__(self, target: PushTarget, name: str, resolve: Resolve, on_error: ErrorHook | None):
        self.name = name
        self._target = target
        self._resolve = resolve
        self._on_error = on_error
        self._cond = threading.Condition()
        self._mailbox = Mailbox(self._cond)
        self._closed = False
        self._busy_since: float | None = None
        self.offered_version = -1
        self.delivered_version = -1
        self.skipped = 0
        self.failures = 0
        self.last_error = ""
        self.call_time = RunningStat()
        self._thread = threading.Thread(target=self._run, name=f"podrace-push-{name}", daemon=True)
        self._thread.start()

    def offer(self, item: Any, version: int) -> None:
        with self._cond:
            if self._closed or version <= self.offered_version:
                return
            if self._mailbox.put(item):
                self.skipped += 1
            self.offered_version = version

    def _run(self) -> None:
        while True:
            with self._cond:
                item = self._mailbox.take(lambda: self._closed)
                if item is None:
                    return
                self._busy_since = time.perf_counter()
            try:
                snapshot = self._resolve(item)
                if snapshot is not None:  # None: the version failed (its transform): skip it
                    self._target(snapshot)
                    self.delivered_version = snapshot.version
            except BaseException as exc:  # reported, never allowed to kill the fan-out
                self._report(exc)
            finally:
                with self._cond:
                    self.call_time.add(time.perf_counter() - (self._busy_since or 0.0))
                    self._busy_since = None

    def _report(self, exc: BaseException) -> None:
        self.failures += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        if self._on_error is None:
            _log.error("push target %r failed: %s", self.name, self.last_error, exc_info=exc)
            return
        try:
            self._on_error(self.name, exc)
        except Exception:
            _log.exception("on_error hook of push target %r failed", self.name)

    def stop(self) -> None:
        """Deliver nothing more; the thread exits after any call in progress."""
        with self._cond:
            self._closed = True
            self._mailbox.item = None
            self._cond.notify_all()

    def join(self, timeout: float) -> None:
        if threading.current_thread() is not self._thread:  # a target may close its publisher
            self._thread.join(timeout)

    def metrics(self) -> dict[str, float | int]:
        p = f"push/{self.name}"
        with self._cond:
            busy = 0.0 if self._busy_since is None else time.perf_counter() - self._busy_since
            out: dict[str, float | int] = {
                f"{p}/delivered_version": self.delivered_version,
                f"{p}/lag": max(0, self.offered_version - self.delivered_version),
                f"{p}/skipped": self.skipped,
                f"{p}/failures": self.failures,
                f"{p}/busy_seconds": busy,
                f"{p}/alive": int(self._thread.is_alive()),
            }
        out.update(self.call_time.report(f"{p}/call_seconds"))
        return out


class PushFanout:
    """All push targets of one publisher."""

    def __init__(self, resolve: Resolve = lambda snapshot: snapshot, close_timeout: float = 1.0):
        self._resolve = resolve
        self._close_timeout = close_timeout
        self._lock = threading.Lock()
        self._workers: dict[str, _PushWorker] = {}
        self._closed = False

    def add(self, target: PushTarget, name: str, on_error: ErrorHook | None = None) -> None:
        if not callable(target):
            raise TypeError(f"push target {name!r} is not callable: {target!r}")
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot add a push target to a closed publisher")
            if name in self._workers:
                raise ValueError(f"push target name {name!r} is already registered")
            self._workers[name] = _PushWorker(target, name, self._resolve, on_error)

    def offer(self, item: Any, version: int, only: str | None = None) -> None:
        """Hand `item` (resolved to a Snapshot on the target's thread) to every target."""
        with self._lock:
            workers = [w for n, w in self._workers.items() if only is None or n == only]
        for worker in workers:
            worker.offer(item, version)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers = list(self._workers.values())
        for worker in workers:
            worker.stop()
        deadline = time.monotonic() + self._close_timeout
        for worker in workers:  # a target stuck in a call is a daemon thread: not waited for long
            worker.join(max(0.0, deadline - time.monotonic()))

    def metrics(self) -> dict[str, float | int]:
        with self._lock:
            workers = list(self._workers.values())
        out: dict[str, float | int] = {}
        for worker in workers:
            out.update(worker.metrics())
        return out
