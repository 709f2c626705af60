"""The subscriber's side of the `shm` transport (see `podrace.sync.shm`): reads the newest
version out of the publisher's seqlocked slots into a private host copy, woken by the
publisher's doorbell.

A subscriber pickles by its channel's name, and a copy that a fork child inherits
re-attaches on first use (fresh locks, its own doorbell connection).
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
import weakref
from typing import Any

import jax
import numpy as np

from podrace.sync.base import (
    ChannelClosed,
    PublisherGone,
    Snapshot,
    Subscriber,
    SyncTimeout,
    wait_limit,
)
from podrace.sync.doorbell import DoorbellClient
from podrace.sync.placement import DeviceKey, device_from_key, device_key
from podrace.sync.shm_layout import (
    ALIGN,
    CLOSED_CLOSED,
    CLOSED_FAILED,
    CLOSED_OPEN,
    SlotReader,
    check_channel_name,
)
from podrace.sync.spec import TreeSpec
from podrace.sync.stats import RunningStat

_names = itertools.count()


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
        check_channel_name(channel)  # "../x" named a file outside /dev/shm: an OSError
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
        return {
            **super().metrics(),
            "torn_read_retries": self._reader.retries,
            **self._read_time.report("read/seconds"),
        }

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


__all__ = ["ShmSubscriber"]
