"""Versioned weight synchronization: one contract (base), several transports.

* `LocalPublisher`: actors are threads of the learner's process (snapshots by reference).
* `ShmPublisher` / `ShmSubscriber`: actor processes on the learner's host (shared memory).
* `RayPublisher` / `RaySubscriber`: Ray workers anywhere in the cluster. Ray is imported
  only when one is created, so `import podrace.sync` works without it.

`Relay` republishes one subscriber into another publisher (one hop per node), the
transforms (`select`, `cast`, `compose`) run once per version on the publishing side, and
`sweep_shm()` removes shared memory left by publishers that died. See the weight sync
guide (docs/guides/weight-sync.md) for examples.
"""

from podrace.sync.base import (
    ChannelClosed,
    Publisher,
    PublisherGone,
    Snapshot,
    SnapshotMismatch,
    Subscriber,
    SyncError,
    SyncTimeout,
)
from podrace.sync.local import LocalPublisher, LocalSubscriber
from podrace.sync.ray_transport import RayPublisher, RaySubscriber
from podrace.sync.relay import Relay
from podrace.sync.shm import ShmPublisher
from podrace.sync.shm_leaks import sweep_shm
from podrace.sync.shm_subscriber import ShmSubscriber
from podrace.sync.spec import TreeSpec
from podrace.sync.transforms import cast, compose, select

__all__ = [
    "ChannelClosed",
    "LocalPublisher",
    "LocalSubscriber",
    "Publisher",
    "PublisherGone",
    "RayPublisher",
    "RaySubscriber",
    "Relay",
    "ShmPublisher",
    "ShmSubscriber",
    "Snapshot",
    "SnapshotMismatch",
    "Subscriber",
    "SyncError",
    "SyncTimeout",
    "TreeSpec",
    "cast",
    "compose",
    "select",
    "sweep_shm",
]
