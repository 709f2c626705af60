"""The weight-sync contract: versioned snapshots, a publisher, subscribers, errors.

Every transport (local, shm, ray) implements these two classes and passes the same
conformance suite, so the actor and learner loops never know which one they use.
"""

from __future__ import annotations

import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PyTree = Any
PushTarget = Callable[["Snapshot"], None]
ErrorHook = Callable[[str, BaseException], None]


@dataclass(frozen=True, eq=False)
class Snapshot:
    """Params as of learner update `version`. Immutable: never write into `params`."""

    version: int
    params: PyTree


class SyncError(RuntimeError):
    """Base class of every weight-sync error."""


class SyncTimeout(SyncError, TimeoutError):
    """`get()` gave up before the awaited version appeared."""


class ChannelClosed(SyncError):
    """The publisher was closed or went away; raised by every pending and later call."""


class PublisherGone(ChannelClosed):
    """Not an orderly close: the publisher's process died, its delivery failed, or it was
    closed with an error (e.g. a relay whose upstream died). The message says which."""


class SnapshotMismatch(SyncError):
    """A snapshot's tree structure, shapes or dtypes differ from what was expected."""


def wait_limit(timeout: float | None) -> float | None:
    """A `timeout` argument as threading waits take it: None, +inf or anything beyond
    `threading.TIMEOUT_MAX` (about 292 years) waits forever, a negative one is 0; NaN is a
    ValueError (it would wait forever or not at all)."""
    if timeout is None or timeout >= threading.TIMEOUT_MAX:
        return None  # threading's waits reject inf and time_t overflows (OverflowError)
    if math.isnan(timeout):
        raise ValueError("timeout is NaN")
    return max(0.0, float(timeout))


class Subscriber(ABC):
    """Consumer side: pulls snapshots when it chooses to.

    Versions a subscriber returns never go backwards, and `poll()` returns each version at
    most once, so applying whatever it returns is always safe and never repeats work.
    """

    @abstractmethod
    def poll(self) -> Snapshot | None:
        """The newest snapshot this subscriber has received, if newer than the last one
        returned, else None. Never blocks.

        Remote transports (ray) receive versions in the background, so for a moment after a
        publish, even after `Publisher.flush()`, this may return None or an older version;
        `get(min_version=v)` is the way to wait for version v.
        """

    @abstractmethod
    def get(self, min_version: int, timeout: float | None = None) -> Snapshot:
        """Block until this subscriber has received a version >= `min_version`, then
        return the newest one it has (as `poll()`: remote transports may trail the latest
        published version for a moment, so only `min_version` is guaranteed).

        Returns at once (the same snapshot again, if nothing is newer) when already
        satisfied. Cross-process transports make a publish visible a moment after
        `publish()` returns (`Publisher.flush()` waits for that). Raises SyncTimeout after
        `timeout` seconds (None, inf or anything beyond `threading.TIMEOUT_MAX` waits
        forever), ChannelClosed if the publisher closes (PublisherGone if it died or failed).
        """

    @property
    @abstractmethod
    def acked_version(self) -> int | None:
        """Version of the last snapshot returned, None before the first."""

    def close(self) -> None:
        """Release this subscriber; its blocked and later calls raise ChannelClosed."""

    def metrics(self) -> dict[str, float | int]:
        """Consumer-side counters (transports add transfer times)."""
        acked = self.acked_version
        return {"acked_version": -1 if acked is None else acked}

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Publisher(ABC):
    """Learner side: announces new params. Never waits on a reader."""

    @abstractmethod
    def publish(self, params: PyTree, *, version: int | None = None) -> int:
        """Make `params` the latest snapshot and return its version.

        Versions count from `first_version` in steps of one; a relay passes `version`
        explicitly to keep its upstream's numbering (it must exceed the latest). Versions
        are never negative (ValueError). Every version has the first one's tree structure,
        shapes and dtypes (else SnapshotMismatch, and nothing is published). The caller must
        not mutate or donate `params` afterwards. If the publisher's transform raises on a
        version, that version is skipped by every subscriber and push target, counted in
        `metrics()` as `transform/failures`, and the channel goes on with the next one.
        """

    @abstractmethod
    def subscribe(self, **transport_args: Any) -> Subscriber:
        """A new subscriber; keyword arguments are transport specific."""

    @abstractmethod
    def add_push_target(
        self, target: PushTarget, name: str, *, on_error: ErrorHook | None = None
    ) -> None:
        """Call `target(snapshot)` for new versions, in order, on a thread of its own.

        A slow target skips to the latest version; a failing one is counted in
        `metrics()` and reported to `on_error(name, exc)`; neither stalls `publish`.
        """

    def flush(self, timeout: float | None = None) -> None:
        """Wait until the latest published version v is visible (or skipped, if its
        transform failed): from then on every subscriber's `get(min_version=v)` returns it
        without waiting for the publisher (a ray subscriber may still be fetching it).

        It does not wait for subscribers: on ray, `poll()` and `get(0)` may return an older
        version for a moment longer (see `Subscriber.poll`). Transports that copy in the
        background (shm, ray) override this; the learner need not call it, but a
        synchronous (lag 0) loop or an orderly shutdown may.
        """

    @abstractmethod
    def close(self, error: str | None = None) -> None:
        """Stop publishing (idempotent); every waiting and later `get()` raises ChannelClosed.

        With `error` (why the params stopped coming, e.g. a relay's upstream died), they
        raise PublisherGone carrying it instead, so the failure is not mistaken for an end.
        """

    @property
    @abstractmethod
    def latest_version(self) -> int | None:
        """Version of the newest published snapshot, None before the first publish."""

    @abstractmethod
    def metrics(self) -> dict[str, float | int]:
        """Flat counters: bytes and time per publish, subscriber acks, push target stats."""

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
