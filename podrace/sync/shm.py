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
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from podrace.sync.background import BackgroundPublisher
from podrace.sync.base import (
    ChannelClosed,
    PublisherGone,
    PyTree,
    Snapshot,
    Subscriber,
    SyncError,
    SyncTimeout,
    wait_limit,
)
from podrace.sync.doorbell import MAX_SOCKET_ADDRESS, Doorbell, DoorbellClient, socket_address
from podrace.sync.placement import DeviceKey, device_from_key, device_key
from podrace.sync.shm_layout import (
    ALIGN,
    CLOSED_CLOSED,
    CLOSED_FAILED,
    CLOSED_OPEN,
    SlotReader,
    SlotWriter,
)
from podrace.sync.shm_leaks import sweep_shm
from podrace.sync.spec import FirstLayout, TreeSpec
from podrace.sync.stats import RunningStat

_names = itertools.count()
_log = logging.getLogger(__name__)


def _check_channel_name(name: str) -> None:
    """SyncError unless `name` can name the channel's segments and doorbell socket: a plain
    name (no "/" or NUL, not "." or "..") whose socket address fits a Unix socket's 108 bytes."""
    if not isinstance(name, str):
        raise SyncError(f"shm channel name must be a str, got {type(name).__name__}")
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise SyncError(
            f"shm channel name {name!r} must be a non-empty name without '/' or NUL, not . or .."
        )
    spare = MAX_SOCKET_ADDRESS - len(socket_address(name).encode())
    if spare < 0:
        raise SyncError(
            f"shm channel name {name!r} is {len(name.encode())} bytes, at most "
            f"{len(name.encode()) + spare} fit the channel's socket address"
        )


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
        _check_channel_name(self.name)  # before any segment or socket exists
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
        if self.closed:
            raise ChannelClosed("subscribe() on a closed publisher")
        return ShmSubscriber(self.name, device, expect=expect, name=name)

    def _check(self, params: PyTree) -> None:
        spec = TreeSpec.of(params)
        spec.check_fixed_size("published params")
        self._published_layout.check(spec)

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


class _BufferPool:
    """Host buffers for copies out of shared memory, reused once no snapshot views them.

    A fresh 256 MB buffer costs ~65k page faults, about as long as the copy itself; a
    buffer is reused only when its reference count shows that every array viewing it is
    gone (NumPy views keep their owner alive, and so do jax arrays placed from them
    without a copy), so a snapshot a caller still holds is never overwritten.
    Buffers are ALIGN-aligned: on CPU, `device_put` then places a leaf without a copy,
    where an unaligned one takes a much slower copy (see benchmarks/shm_device_read.py).
    """

    def __init__(self, max_buffers: int = 4) -> None:
        self._owners: list[np.ndarray] = []
        self._max = max_buffers

    def take(self, nbytes: int) -> np.ndarray:
        for owner in self._owners:
            # references: the list, `owner`, getrefcount's argument -> nothing else views it
            if owner.nbytes == nbytes + ALIGN and sys.getrefcount(owner) <= 3:
                return _aligned(owner, nbytes)
        owner = np.empty(nbytes + ALIGN, dtype=np.uint8)
        if len(self._owners) < self._max:
            self._owners.append(owner)
        return _aligned(owner, nbytes)

    def clear(self) -> None:
        self._owners = []


def _aligned(owner: np.ndarray, nbytes: int) -> np.ndarray:
    """`nbytes` of `owner` starting at an ALIGN boundary (a writable view of it)."""
    start = -owner.ctypes.data % ALIGN
    return owner[start : start + nbytes]


class ShmSubscriber(Subscriber):
    """Reads an shm channel from any process on the host.

    Args:
      channel: the publisher's `name`.
      device: a jax Device/Sharding to place snapshots on (a private host copy out of
        shared memory, then `device_put`), or None for read-only host NumPy arrays.
      expect: a params-like pytree or TreeSpec every snapshot must match.
      name: label in the publisher's metrics.
    """

    def __init__(
        self, channel: str, device: Any = None, *, expect: Any = None, name: str | None = None
    ):
        _check_channel_name(channel)  # "../x" named a file outside /dev/shm: an OSError
        self.channel = channel
        self.name = name or f"pid{os.getpid()}-{next(_names)}"
        self._device = device
        self._expect = None if expect is None else TreeSpec.of(expect)
        self._cond = threading.Condition()
        self._lock = threading.Lock()
        self._closed = False
        self._gone = False
        self._acked: int | None = None
        self._last: Snapshot | None = None
        self._read_time = RunningStat()
        self._pool = _BufferPool()
        self._reader = SlotReader(channel)
        self._release: weakref.finalize | None = None
        try:
            self._attach()
        except ChannelClosed:
            self._reader.close()
            raise
        _subscribers.add(self)

    def _attach(self) -> None:
        """Connect to the publisher's doorbell, or raise why nobody listens there."""
        me = weakref.ref(self)  # the doorbell thread must not keep a dropped subscriber alive
        try:
            bell = DoorbellClient(
                self.channel,
                self.name,
                lambda: _call(me, "_on_ring"),
                lambda: _call(me, "_on_gone"),
            )
        except ConnectionError as exc:
            self._check_open()  # it closed or failed: say so
            raise PublisherGone(
                f"shm channel {self.channel!r}: publisher went away (nobody listens)"
            ) from exc
        if self._release is not None:
            self._release.detach()  # an inherited copy's: its socket is closed (see doorbell)
        self._bell = bell
        # A subscriber dropped without close() (e.g. one unpickled per pool task) releases its
        # thread, socket, mappings and buffers when collected, instead of leaking them.
        self._release = weakref.finalize(self, _release, bell, self._reader)
        self._attached = True

    def _inherited(self) -> None:
        """In a fork child: fresh locks (a parent thread may have held one at the fork), and
        re-attach on first use."""
        self._cond = threading.Condition()
        self._lock = threading.Lock()
        self._attached = False

    def _ensure_attached(self) -> None:
        if not self._attached:
            with self._lock:
                if not self._attached and not self._closed:
                    self._attach()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reattach, (self.channel, device_key(self._device), self._expect, self.name))

    # -- doorbell callbacks ------------------------------------------------------------
    def _on_ring(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _on_gone(self) -> None:
        with self._cond:
            self._gone = True
            self._cond.notify_all()

    # -- Subscriber --------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ChannelClosed(f"subscriber {self.name!r} is closed")
        state = self._reader.closed_state()
        if state == CLOSED_CLOSED:
            raise ChannelClosed(f"shm channel {self.channel!r} was closed by its publisher")
        if state == CLOSED_FAILED:
            raise PublisherGone(
                f"shm channel {self.channel!r}: publisher failed: {self._reader.closed_reason()}"
            )
        if state != CLOSED_OPEN or self._gone:
            raise PublisherGone(
                f"shm channel {self.channel!r}: publisher went away (its process ended)"
            )

    def poll(self) -> Snapshot | None:
        self._ensure_attached()
        with self._lock:
            self._check_open()
            latest = self._reader.ctl.latest_version()
            if latest is None or (self._acked is not None and latest <= self._acked):
                return None
            snapshot = self._read(attempts=64)
            if snapshot is None or (self._acked is not None and snapshot.version <= self._acked):
                return None
            return self._accept(snapshot)

    def get(self, min_version: int, timeout: float | None = None) -> Snapshot:
        timeout = wait_limit(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        self._ensure_attached()
        with self._cond:
            while True:
                self._check_open()
                latest = self._reader.ctl.latest_version()
                if latest is not None and latest >= min_version:
                    break
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise SyncTimeout(
                        f"subscriber {self.name!r}: no version >= {min_version} within {timeout}s "
                        f"(latest is {latest})"
                    )
                self._cond.wait(remaining)
        with self._lock:
            self._check_open()
            while True:
                last = self._last
                if last is not None and last.version == self._reader.ctl.latest_version():
                    return self._accept(last)  # nothing newer: same snapshot, no copy
                snapshot = self._read(attempts=64)
                if snapshot is not None:
                    return self._accept(snapshot)
                if deadline is not None and time.monotonic() > deadline:
                    raise SyncTimeout(f"subscriber {self.name!r}: every read raced with the writer")

    def _accept(self, snapshot: Snapshot) -> Snapshot:
        if snapshot.version != self._acked:
            self._bell.ack(snapshot.version)
        self._acked = snapshot.version
        self._last = snapshot
        return snapshot

    def _read(self, attempts: int) -> Snapshot | None:
        reader = self._reader
        start = time.perf_counter()

        def copy_out(slot: np.ndarray) -> np.ndarray:
            layout = reader.layout
            assert layout is not None
            buf = self._pool.take(layout.used_bytes)
            np.copyto(buf, slot[: layout.used_bytes])
            return buf

        got = reader.read(copy_out, attempts)
        if got is None:
            return None
        layout = reader.layout
        assert layout is not None
        version, buf = got
        # Only a private copy, validated by the seqlock, is handed on: `device_put` of a
        # NumPy array may alias it on CPU, so placing straight from the slot would return
        # arrays that the writer rewrites later.
        buf.flags.writeable = False  # snapshots are immutable
        leaves: list[Any] = layout.views(buf)  # the pool reuses `buf` once no array views it
        if self._device is not None:
            leaves = jax.block_until_ready(jax.device_put(leaves, self._device))
        params = jax.tree_util.tree_unflatten(layout.spec.treedef, leaves)
        if self._expect is not None:
            self._expect.check(params, f"shm version {version} for {self.name!r}")
        self._read_time.add(time.perf_counter() - start)
        return Snapshot(version, params)

    @property
    def acked_version(self) -> int | None:
        return self._acked

    def metrics(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {
            "acked_version": -1 if self._acked is None else self._acked,
            "torn_read_retries": self._reader.retries,
        }
        out.update(self._read_time.report("read/seconds"))
        return out

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        with self._lock:
            self._last = None
            self._pool.clear()
            assert self._release is not None
            self._release()  # the doorbell, then the mappings; once


_subscribers: weakref.WeakSet[ShmSubscriber] = weakref.WeakSet()


def _inherited_by_fork_child() -> None:
    for sub in list(_subscribers):
        sub._inherited()


os.register_at_fork(after_in_child=_inherited_by_fork_child)


def _call(ref: weakref.ref[ShmSubscriber], method: str) -> None:
    sub = ref()
    if sub is not None:
        getattr(sub, method)()


def _release(bell: DoorbellClient, reader: SlotReader) -> None:
    bell.close()
    reader.close()


def _reattach(channel: str, device: DeviceKey, expect: Any, name: str) -> ShmSubscriber:
    return ShmSubscriber(channel, device_from_key(device), expect=expect, name=name)
