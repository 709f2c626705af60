"""Publisher skeleton for transports that copy (shm, ray): the copy runs off the learner.

`publish` records a reference to the (non-donated) params and wakes one delivery thread.
That thread takes the newest pending version (older ones are coalesced away), transforms it
once, brings it to host memory and hands it to the transport's `_deliver`. The learner pays
bookkeeping only, and never waits on a reader.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import abstractmethod
from collections.abc import Callable

import jax
import numpy as np

from podrace.sync.base import (
    PyTree,
    SyncError,
    SyncTimeout,
    wait_limit,
)
from podrace.sync.publisher_base import VersionedPublisher, check_keep
from podrace.sync.push import Mailbox
from podrace.sync.spec import TreeSpec
from podrace.sync.stats import RunningStat
from podrace.sync.versions import Published, TransformStage, release_later

_log = logging.getLogger(__name__)


class BackgroundPublisher(VersionedPublisher):
    """Shared by ShmPublisher and RayPublisher; subclasses implement the `_` hooks."""

    def __init__(
        self,
        transform: Callable[[PyTree], PyTree] | None,
        keep: int,
        first_version: int,
        label: str,
    ) -> None:
        check_keep(keep)
        super().__init__(TransformStage(transform, label, finish=self._to_host), first_version)
        self._label = label
        self._pending = Mailbox(self._cond)
        """The newest version not yet delivered (older ones are coalesced away)."""
        self._latest: Published | None = None  # for push targets added late
        self._visible: int | None = None
        self._settled: int | None = None  # newest version delivered or failed
        self._failure: BaseException | None = None
        self._stats = {k: RunningStat() for k in ("deliver", "visible")}
        self._coalesced = 0
        self._thread = threading.Thread(
            target=self._deliver_loop, name=f"podrace-{label}-delivery", daemon=True
        )

    def _start(self) -> None:
        """Called by the subclass once its transport is ready."""
        self._thread.start()

    # -- transport hooks (and `_admit`: params the transport cannot carry) --------------
    def _check_host(self, host: PyTree) -> PyTree:
        """Reject a transformed version the transport cannot carry (it raises; runs in the
        transform stage, so only that version fails, not the channel). Returns `host`."""
        return host

    @abstractmethod
    def _deliver(self, version: int, host: PyTree, spec: TreeSpec) -> None:
        """Make `host` (NumPy leaves) visible to subscribers as `version`."""

    @abstractmethod
    def _fail(self, reason: str) -> None:
        """Tell subscribers that delivery failed (they raise PublisherGone with `reason`)."""

    @abstractmethod
    def _shutdown(self, error: str | None) -> None:
        """Release the transport after the delivery thread stopped; subscribers raise
        ChannelClosed, or PublisherGone with `error` if given."""

    def _transport_metrics(self) -> dict[str, float | int]:
        return {}

    # -- VersionedPublisher hooks ----------------------------------------------------------
    def _admit(self, params: PyTree) -> None:
        self._raise_if_failed()
        super()._admit(params)

    def _accept(self, entry: Published, start: float) -> None:
        entry.published_at = start  # type: ignore[attr-defined]
        if self._latest is not None:
            release_later(self._latest)  # its host copy is freed off the learner's thread
        self._latest = entry
        if self._pending.put(entry):
            self._coalesced += 1

    def _newest(self) -> Published | None:
        return self._latest

    def _channel_metrics(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {
            "visible_version": -1 if self._visible is None else self._visible,
            "coalesced": self._coalesced,
            "failed": int(self._failure is not None),
        }
        for key, stat in self._stats.items():
            out.update(stat.report(f"{key}/seconds"))
        out.update(self._transport_metrics())
        return out

    # -- Publisher ----------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> None:
        timeout = wait_limit(timeout)
        with self._cond:
            done = self._cond.wait_for(
                lambda: (
                    self._closed
                    or self._failure is not None
                    or self._settled == self._versions.latest
                ),
                timeout,
            )
            self._raise_if_failed()
            if not done:
                raise SyncTimeout(
                    f"flush: version {self._versions.latest} not visible within {timeout}s "
                    f"(visible: {self._visible})"
                )

    def close(self, error: str | None = None) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._pending.item = self._latest = None
            self._cond.notify_all()
        self._thread.join(60)  # at most one delivery in progress
        if error is None and self._failure is not None:
            error = self._failure_reason()
        self._shutdown(error)
        self._push.close()

    def _to_host(self, params: PyTree) -> PyTree:
        """The transformed params in host memory (NumPy leaves), checked by `_check_host`."""
        return self._check_host(jax.tree_util.tree_map(np.asarray, jax.device_get(params)))

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise SyncError(f"{self._label} delivery failed; channel closed") from self._failure

    def _failure_reason(self) -> str:
        return f"{self._label} delivery failed: {type(self._failure).__name__}: {self._failure}"

    # -- delivery thread ------------------------------------------------------------------
    def _deliver_loop(self) -> None:
        while True:
            with self._cond:
                entry = self._pending.take(lambda: self._closed)
                if entry is None:
                    return
            try:
                # an Exception in the transform fails that version only (None); anything
                # else (SystemExit, ...) fails the channel below, never the thread silently
                snapshot = self._stage.apply(entry)  # shared with push targets
                if (
                    snapshot is None
                ):  # its transform failed: this version is skipped, not the channel
                    with self._cond:
                        self._settled = entry.version
                        self._cond.notify_all()
                    continue
                spec = TreeSpec.of(snapshot.params)
                self._bytes = spec.nbytes
                start = time.perf_counter()
                self._deliver(entry.version, snapshot.params, spec)
                done = time.perf_counter()
                self._stats["deliver"].add(done - start)
                self._stats["visible"].add(done - entry.published_at)  # type: ignore[attr-defined]
                with self._cond:
                    self._visible = self._settled = entry.version
                    self._cond.notify_all()
            except BaseException as exc:  # noqa: BLE001 - kept, re-raised by publish()/flush()
                _log.error("%s delivery failed; channel closed", self._label, exc_info=exc)
                with self._cond:
                    self._failure = exc
                    self._cond.notify_all()
                try:
                    self._fail(self._failure_reason())
                except Exception:  # noqa: BLE001 - best effort: the transport may be broken
                    _log.exception("%s: could not tell subscribers about the failure", self._label)
                return
