"""Versioned weight synchronization: one contract (base), several transports.

`local` (threads in one process) is imported eagerly; `shm` and `ray` are imported from
their modules (`podrace.sync.shm`, `podrace.sync.ray_transport`) so that Ray stays optional.
Transforms for publishers live in `podrace.sync.transforms`.
"""

from podrace.sync.base import (
    ChannelClosed,
    Publisher,
    Snapshot,
    SnapshotMismatch,
    Subscriber,
    SyncError,
    SyncTimeout,
)
from podrace.sync.local import LocalPublisher, LocalSubscriber
from podrace.sync.relay import Relay
from podrace.sync.shm_sweep import sweep_shm
from podrace.sync.spec import TreeSpec

__all__ = [
    "ChannelClosed",
    "LocalPublisher",
    "LocalSubscriber",
    "Publisher",
    "Relay",
    "Snapshot",
    "SnapshotMismatch",
    "Subscriber",
    "SyncError",
    "SyncTimeout",
    "TreeSpec",
    "sweep_shm",
]
