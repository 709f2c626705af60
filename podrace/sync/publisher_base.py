"""What every publisher here keeps alike: the version counter, the closed flag, the
transform stage, push targets, publish timing and the metrics they all report.

`LocalPublisher` (versions by reference) and `BackgroundPublisher` (shm, ray: versions copied
off the learner) differ in how a published version reaches subscribers; they say that in
`_accept` and keep the versions themselves.
"""

from __future__ import annotations

import threading
import time
from abc import abstractmethod

from podrace.sync.base import ChannelClosed, ErrorHook, Publisher, PushTarget, PyTree
from podrace.sync.push import PushFanout
from podrace.sync.spec import FirstLayout
from podrace.sync.stats import RunningStat
from podrace.sync.versions import Published, TransformStage, VersionCounter


def check_keep(keep: int) -> int:
    """`keep` (how many recent versions a transport keeps), which must be >= 1."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    return keep


class VersionedPublisher(Publisher):
    """Publisher bookkeeping shared by every transport; subclasses implement the `_` hooks.

    Args:
      stage: turns a published version into what consumers get (the transport's transform
        and finish: a host copy, a layout check, a byte count).
      first_version: version of the first publish.
    """

    def __init__(self, stage: TransformStage, first_version: int) -> None:
        self._cond = threading.Condition()
        """Guards the channel's state; subscribers and delivery threads wait on it."""
        self._versions = VersionCounter(first_version)
        self._closed = False
        self._published_layout = FirstLayout("published params")
        self._stage = stage
        self._push = PushFanout(resolve=self._stage.apply)
        self._publish_time = RunningStat()
        self._bytes = 0  # size of the newest transformed version

    # -- hooks ----------------------------------------------------------------------------
    def _admit(self, params: PyTree) -> None:
        """Reject params that cannot be published (under the lock, in the learner's thread):
        by default, a layout other than the first version's."""
        self._published_layout.check(params)

    @abstractmethod
    def _accept(self, entry: Published, start: float) -> None:
        """Keep `entry` (published at `start`, a perf_counter time) and wake whoever
        delivers it; called under the lock."""

    @abstractmethod
    def _newest(self) -> Published | None:
        """The newest version kept, for a push target added late; None if none (or closed)."""

    @abstractmethod
    def _channel_metrics(self) -> dict[str, float | int]:
        """The transport's own counters, added to `metrics()`."""

    # -- Publisher --------------------------------------------------------------------------
    def publish(self, params: PyTree, *, version: int | None = None) -> int:
        start = time.perf_counter()
        with self._cond:
            self._check_open("publish")
            self._admit(params)
            entry = Published(self._versions.next(version), params)
            self._accept(entry, start)
            self._push.offer(entry, entry.version)  # under the lock: targets see versions in order
        self._publish_time.add(time.perf_counter() - start)
        return entry.version

    def add_push_target(
        self, target: PushTarget, name: str, *, on_error: ErrorHook | None = None
    ) -> None:
        with self._cond:
            self._check_open("add_push_target")
            self._push.add(target, name, on_error)
            newest = self._newest()
            if newest is not None:  # a late target starts from the current version
                self._push.offer(newest, newest.version, only=name)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def latest_version(self) -> int | None:
        return self._versions.latest

    def metrics(self) -> dict[str, float | int]:
        latest = self.latest_version
        out: dict[str, float | int] = {
            "latest_version": -1 if latest is None else latest,
            "publish/bytes": self._bytes,
        }
        out.update(self._publish_time.report("publish/seconds"))
        out.update(self._stage.metrics())
        out.update(self._channel_metrics())
        out.update(self._push.metrics())
        return out

    def _check_open(self, what: str) -> None:
        """Raise ChannelClosed for a call (`what`) on a closed publisher."""
        if self._closed:
            raise ChannelClosed(f"{what}() on a closed publisher")
