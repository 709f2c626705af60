"""`ray` transport: subscribers in other Ray workers, on any node of the cluster.

Each version is ONE object in the Ray object store (`ray.put` on a background thread, after
the transform and a host copy). A small async "board" actor (`ray_board`), owned by the
publisher's process, holds a reference to the newest object only; the publisher keeps the
last `keep`. Once both have moved on and no subscriber still holds its arrays, Ray frees
the object. Readers on one node share that node's copy of each object, so a node costs one
transfer.

Every subscriber runs a fetch thread that long-polls the board (an awaited condition on the
actor, not a sleep loop), pulls the newest object and places it on the subscriber's device;
`poll()` then never blocks and `get()` waits on a local condition. If the publisher's
process dies, the board dies with it and waiting subscribers raise ChannelClosed.

Deployment: size the object store for about keep + 2 copies of the params per node, and
for large params start Ray with `preallocate_plasma_memory` (e.g. `ray.init(...,
object_store_memory=..., _system_config={"preallocate_plasma_memory": True})`): otherwise a
`ray.put` that lands on never-touched store pages pays their first-touch faults, which made
back-to-back 256 MB publishes several times slower in benchmarks/sync_bench.py.

Ray is imported only when this module is used: `pip install podrace[ray]`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import jax

from podrace.sync.background import BackgroundPublisher
from podrace.sync.base import (
    ChannelClosed,
    PublisherGone,
    PyTree,
    Snapshot,
    SnapshotMismatch,
    Subscriber,
    SyncError,
    SyncTimeout,
    wait_limit,
)
from podrace.sync.placement import DeviceKey, device_from_key, device_key
from podrace.sync.ray_board import connected, process_board, ray_module
from podrace.sync.spec import TreeSpec, unreadable_tree
from podrace.sync.stats import RunningStat

_names = itertools.count()


class RayPublisher(BackgroundPublisher):
    """Publishes through the Ray object store; see the module docstring.

    Needs `ray.init()` (or to run inside a Ray worker). Args as for LocalPublisher.
    """

    def __init__(
        self,
        transform: Callable[[PyTree], PyTree] | None = None,
        keep: int = 2,
        first_version: int = 0,
    ) -> None:
        ray = ray_module()
        if not ray.is_initialized():
            raise SyncError("RayPublisher needs a running Ray: call ray.init() first")
        super().__init__(transform, keep, first_version, label="ray")
        self._ray = ray
        self._refs: deque[Any] = deque(maxlen=keep)
        self.board = process_board()
        self.channel = uuid.uuid4().hex
        ray.get(self.board.open.remote(self.channel))  # before any subscriber can ask for it
        self._start()

    def subscribe(
        self,
        device: Any = None,
        *,
        expect: Any = None,
        name: str | None = None,
        long_poll: float = 5.0,
    ) -> RaySubscriber:
        """A subscriber (see RaySubscriber); it pickles, so pass it to Ray tasks and actors."""
        self._check_open("subscribe")
        return RaySubscriber(
            self.board, self.channel, device, expect=expect, name=name, long_poll=long_poll
        )

    def _deliver(self, version: int, host: PyTree, spec: TreeSpec) -> None:
        if not connected():
            raise SyncError("ray publisher: Ray was shut down in this process")
        ref = self._ray.put(host)  # the one object of this version
        self._ray.get(
            self.board.set.remote(self.channel, version, [ref])
        )  # in a list: stays a reference
        self._refs.append(ref)  # the oldest falls out: Ray frees it once readers let go

    def _fail(self, reason: str) -> None:
        if connected():
            self.board.close.remote(self.channel, reason)

    def _shutdown(self, error: str | None) -> None:
        # Wakes every waiting subscriber with "closed" and drops the board's reference;
        # best effort, since the board may already be gone with its process.
        with contextlib.suppress(Exception):
            if connected():
                self._ray.get(self.board.close.remote(self.channel, error), timeout=10)
        self._refs.clear()

    def _transport_metrics(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {"objects_alive": len(self._refs)}
        if self.closed or not connected():
            return out
        try:
            acks = self._ray.get(self.board.acks.remote(self.channel), timeout=5)
        except Exception:  # noqa: BLE001 - metrics must not raise
            return out
        latest = self.latest_version
        for name, acked in acks.items():
            out[f"subscriber/{name}/acked_version"] = acked
            out[f"subscriber/{name}/lag"] = 0 if latest is None or acked < 0 else latest - acked
        return out


class RaySubscriber(Subscriber):
    """Reads a RayPublisher from any Ray worker (or the driver); see the module docstring.

    Args:
      board, channel: the publisher's `board` actor handle and `channel` id.
      device: jax Device/Sharding for the snapshots, or None for read-only NumPy arrays.
      expect: a params-like pytree or TreeSpec every snapshot must match.
      name: label in the publisher's metrics (copies of one pickled subscriber are
        reported as `name`, `name#2`, ...: each has its own id on the board).
      long_poll: seconds one board wait may last (how long the fetch thread can outlive
        close() if cancelling its wait fails). A subscriber silent for 2 x long_poll + 5 s
        (its process died) is dropped from the publisher's metrics.
    """

    def __init__(
        self,
        board: Any,
        channel: str,
        device: Any = None,
        *,
        expect: Any = None,
        name: str | None = None,
        long_poll: float = 5.0,
    ) -> None:
        self._board = board
        self.channel = channel
        self.name = name or f"pid{os.getpid()}-{next(_names)}"
        self._id = uuid.uuid4().hex  # not pickled: the board tells copies apart by it
        self._device = device
        self._expect = None if expect is None else TreeSpec.of(expect)
        self._long_poll = long_poll
        self._grace = 2 * long_poll + 5.0  # between two waits: one fetch and placement
        self._cond = threading.Condition()
        self._latest: Snapshot | None = None
        self._acked: int | None = None
        self._closed = False
        self._ended: SyncError | None = None  # publisher closed or gone, or unreadable
        self._error: SyncError | None = None  # e.g. SnapshotMismatch of the newest version
        self._thread: threading.Thread | None = None
        self._call: Any = None
        self._forget: weakref.finalize | None = None
        self._transfer_time = RunningStat()
        self._fetched: deque[int] = deque(maxlen=1024)
        """Versions fetched (pulled from the object store) since `take_fetched`."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _reattach,
            (
                self._board,
                self.channel,
                device_key(self._device),
                self._expect,
                self.name,
                self._long_poll,
            ),
        )

    def _start(self) -> None:
        with self._cond:
            if self._thread is None and not self._closed:
                # The thread holds the subscriber only during one board wait: one dropped
                # without close() (e.g. unpickled per Ray task) is collected, its thread
                # ends and the board forgets it, instead of pulling every version forever.
                self._thread = threading.Thread(
                    target=_fetch_loop,
                    args=(weakref.ref(self),),
                    name=f"podrace-ray-fetch-{self.name}",
                    daemon=True,
                )
                self._forget = weakref.finalize(self, _forget, self._board, self.channel, self._id)
                self._forget.atexit = False
                self._thread.start()

    def _fetch_step(self, last: int) -> int | None:
        """One board wait, and the fetch of what it announced; the next `last`, or None
        once the thread must end."""
        ray = ray_module()
        try:
            with self._cond:  # close() cancels exactly the call issued before it
                if self._closed:
                    return None
                if not connected():
                    self._ended = PublisherGone(
                        f"ray subscriber {self.name!r}: Ray was shut down in this process"
                    )
                    self._cond.notify_all()
                    return None
                self._call = call = self._board.wait.remote(
                    self.channel, last + 1, self._long_poll, self._id, self.name, self._grace
                )
            try:
                status, version, refs = ray.get(call)  # refs: the error text when "closed"
            finally:
                del call
                with self._cond:
                    self._call = None  # hold no reference once the wait is over
            with self._cond:
                if self._closed:
                    return None
            if status == "timeout":
                return last
            if status == "closed":
                if refs is not None:
                    self._end(PublisherGone(f"ray channel: publisher failed: {refs}"))
                else:
                    self._end(
                        ChannelClosed(
                            f"ray channel closed by its publisher (subscriber {self.name!r})"
                        )
                    )
                return None
            start = time.perf_counter()
            try:
                params = ray.get(refs[0])
            except (
                ray.exceptions.RaySystemError
            ) as exc:  # e.g. the params' type is not importable here
                self._end(unreadable_tree(f"ray subscriber {self.name!r}, version {version}", exc))
                return None
            if self._device is not None:
                params = jax.block_until_ready(jax.device_put(params, self._device))
            self._transfer_time.add(time.perf_counter() - start)
            self._fetched.append(version)
        except ray.exceptions.TaskCancelledError:
            return None  # close() interrupted the long poll
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as exc:
            if not self._closed:
                self._end(PublisherGone(f"ray channel: publisher went away ({type(exc).__name__})"))
            return None
        except BaseException as exc:  # noqa: BLE001 - surfaced by the next poll()/get()
            self._end(ChannelClosed(f"ray subscriber {self.name!r} fetch failed: {exc!r}"))
            return None
        error: SyncError | None = None
        if self._expect is not None:
            try:
                self._expect.check(params, f"ray version {version} for {self.name!r}")
            except SnapshotMismatch as exc:
                error = exc
        with self._cond:
            self._error = error
            if error is None:
                self._latest = Snapshot(version, params)
            self._cond.notify_all()
        return version

    def _end(self, reason: SyncError) -> None:
        with self._cond:
            self._ended = reason
            self._cond.notify_all()

    def _raise_if_done(self) -> None:
        if self._closed:
            raise ChannelClosed(f"subscriber {self.name!r} is closed")
        if self._ended is not None:
            raise self._ended
        if self._error is not None:
            raise self._error

    def _accept(self, snapshot: Snapshot) -> Snapshot:
        if snapshot.version != self._acked:
            self._acked = snapshot.version
            if connected():
                self._board.ack.remote(
                    self.channel, self._id, self.name, snapshot.version, self._grace
                )  # fire and forget
        return snapshot

    def poll(self) -> Snapshot | None:
        self._start()
        with self._cond:
            self._raise_if_done()
            latest = self._latest
            if latest is None or (self._acked is not None and latest.version <= self._acked):
                return None
            return self._accept(latest)

    def get(self, min_version: int, timeout: float | None = None) -> Snapshot:
        timeout = wait_limit(timeout)
        self._start()
        with self._cond:
            ready = lambda: (  # noqa: E731
                self._closed
                or self._ended is not None
                or self._error is not None
                or (self._latest is not None and self._latest.version >= min_version)
            )
            if not self._cond.wait_for(ready, timeout):
                latest = None if self._latest is None else self._latest.version
                raise SyncTimeout(
                    f"subscriber {self.name!r}: no version >= {min_version} within {timeout}s "
                    f"(latest is {latest})"
                )
            self._raise_if_done()
            assert self._latest is not None
            return self._accept(self._latest)

    @property
    def acked_version(self) -> int | None:
        return self._acked

    def take_fetched(self) -> list[int]:
        """The versions this subscriber pulled from the object store since the last call (at
        most the last 1024): Ray moves each object to a node once, so these say which
        versions reached this subscriber's node."""
        taken = []
        while self._fetched:
            taken.append(self._fetched.popleft())
        return taken

    def metrics(self) -> dict[str, float | int]:
        return {**super().metrics(), **self._transfer_time.report("transfer/seconds")}

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._latest = None
            self._cond.notify_all()
            call, self._call = self._call, None
            if self._forget is not None:
                self._forget.detach()  # forgotten below
        # Interrupts the long poll (the daemon fetch thread exits on its own); the call may
        # have finished already, or the board be gone: nothing is left to release then.
        with contextlib.suppress(Exception):
            if connected():
                if call is not None:
                    ray_module().cancel(call)
                self._board.forget.remote(self.channel, self._id)


def _fetch_loop(ref: weakref.ref[RaySubscriber]) -> None:
    last: int | None = -1
    while last is not None:
        sub = ref()
        if sub is None:
            return  # dropped without close(): its finalizer told the board
        last = sub._fetch_step(last)
        del sub


def _forget(board: Any, channel: str, subscriber: str) -> None:
    with contextlib.suppress(Exception):  # best effort: Ray or the board may be gone
        if connected():
            board.forget.remote(channel, subscriber)


def _reattach(
    board: Any, channel: str, device: DeviceKey, expect: Any, name: str, long_poll: float
) -> RaySubscriber:
    return RaySubscriber(
        board, channel, device_from_key(device), expect=expect, name=name, long_poll=long_poll
    )
