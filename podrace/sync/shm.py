"""`shm` transport: subscriber processes on the publisher's host read shared memory.

`publish` only records a reference (the learner does not donate its buffers); a delivery
thread (see `background`) transforms the newest version once, brings it to host memory and
copies it into a seqlocked slot (see `shm_layout`); versions published faster than they can
be copied are coalesced. A Unix-socket doorbell (see `doorbell`) wakes blocked readers and
tells them at once when the publisher closes or its process dies.

A subscriber is created in the consumer's process from the channel name alone:
`ShmSubscriber(publisher.name, device)`; `publisher.subscribe()` builds one for the
publisher's own process (handy for tests and relays), and subscribers pickle by name. A
copy that a fork child inherits re-attaches on first use, as an unpickled one does: the
child has no doorbell thread, and the parent's connection is not the child's to use.

This module is the publisher's side; the subscriber's is `podrace.sync.shm_subscriber`.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable
from typing import Any

import jax

from podrace.sync.background import BackgroundPublisher
from podrace.sync.base import (
    PyTree,
    SyncError,
)
from podrace.sync.doorbell import Doorbell
from podrace.sync.shm_layout import (
    CLOSED_CLOSED,
    CLOSED_FAILED,
    SlotWriter,
    check_channel_name,
)
from podrace.sync.shm_leaks import sweep_shm
from podrace.sync.shm_subscriber import ShmSubscriber
from podrace.sync.spec import FirstLayout, TreeSpec

_log = logging.getLogger(__name__)


class ShmPublisher(BackgroundPublisher):
    """Publishes into POSIX shared memory; see the module docstring.

    Args:
      transform: applied once per written version, on the writer thread.
      keep: versions readable at once; the segment holds keep + 1 slots of the params' size.
      first_version: version of the first publish (>= 0).
      name: channel name (default: unique per publisher).
    """

    def __init__(
        self,
        transform: Callable[[PyTree], PyTree] | None = None,
        keep: int = 2,
        first_version: int = 0,
        name: str | None = None,
    ) -> None:
        super().__init__(transform, keep, first_version, label="shm")
        self.name = name or f"podrace_{os.getpid()}_{secrets.token_hex(4)}"
        check_channel_name(self.name)  # before any segment or socket exists
        self._owner = os.getpid()
        self._host_layout = FirstLayout("transformed params")  # the slots' layout
        swept = sweep_shm()  # segments leaked by publishers that died (see shm_leaks)
        if swept:
            _log.warning(
                "removed %d shared-memory segments of dead publishers: %s",
                len(swept),
                ", ".join(swept),
            )
        self._writer = SlotWriter(self.name, nslots=keep + 1)
        self._doorbell = Doorbell(self.name)
        self._start()

    # A copy a fork child inherits has no delivery thread and shares the parent's segments:
    # it must neither publish (a duplicate version; flush would wait forever) nor close them.
    def _check_owner(self, what: str) -> None:
        if os.getpid() != self._owner:
            raise SyncError(
                f"{what}() on shm channel {self.name!r} in a fork child: the publisher belongs to "
                f"process {self._owner} (create a publisher in this process)"
            )

    def publish(self, params: PyTree, *, version: int | None = None) -> int:
        self._check_owner("publish")
        return super().publish(params, version=version)

    def flush(self, timeout: float | None = None) -> None:
        self._check_owner("flush")
        super().flush(timeout)

    def close(self, error: str | None = None) -> None:
        """Close the channel; in a fork child, a no-op (the channel is the parent's)."""
        if os.getpid() == self._owner:
            super().close(error)

    def subscribe(
        self, device: Any = None, *, expect: Any = None, name: str | None = None
    ) -> ShmSubscriber:
        """A subscriber in this process; other processes use `ShmSubscriber(publisher.name)`."""
        self._check_open("subscribe")
        return ShmSubscriber(self.name, device, expect=expect, name=name)

    def _admit(self, params: PyTree) -> None:
        spec = TreeSpec.of(params)
        spec.check_fixed_size("published params")
        super()._admit(spec)

    def _check_host(self, host: PyTree) -> PyTree:
        # A transform that returns another structure, shape or dtype than the first
        # version's, or Python objects, fails that version (counted in transform/failures),
        # as if it had raised: the slots' layout is fixed, and the channel goes on.
        spec = TreeSpec.of(host)
        spec.check_fixed_size("transformed params")
        self._host_layout.check(spec)
        return host

    def _deliver(self, version: int, host: PyTree, spec: TreeSpec) -> None:
        self._writer.write(version, jax.tree_util.tree_leaves(host), spec)
        self._doorbell.ring(version)

    def _fail(self, reason: str) -> None:
        self._writer.mark_closed(CLOSED_FAILED, reason)
        self._doorbell.ring(-1)

    def _shutdown(self, error: str | None) -> None:
        # marked before readers see the doorbell's EOF, so they report why
        self._writer.close(CLOSED_CLOSED if error is None else CLOSED_FAILED, error or "")
        self._doorbell.close()

    def _transport_metrics(self) -> dict[str, float | int]:
        latest = self.latest_version
        out: dict[str, float | int] = {}
        for name, acked in self._doorbell.acks().items():
            out[f"subscriber/{name}/acked_version"] = acked
            out[f"subscriber/{name}/lag"] = 0 if latest is None or acked < 0 else latest - acked
        return out
