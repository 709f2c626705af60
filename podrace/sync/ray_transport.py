"""`ray` transport: subscribers in other Ray workers, on any node of the cluster.

Each version is ONE object in the Ray object store (`ray.put` on a background thread, after
the transform and a host copy). A small async "board" actor, owned by the publisher's
process, holds a reference to the newest object only; the publisher keeps the last `keep`.
Once both have moved on and no subscriber still holds its arrays, Ray frees the object.
Readers on one node share that node's copy of each object, so a node costs one transfer.

Every subscriber runs a fetch thread that long-polls the board (an awaited condition on the
actor, not a sleep loop), pulls the newest object and places it on the subscriber's device;
`poll()` then never blocks and `get()` waits on a local condition. If the publisher's
process dies, the board dies with it and waiting subscribers raise ChannelClosed.

Ray is imported only when this module is used: `pip install podrace[ray]`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
import uuid
from collections import deque
from typing import Any, Callable

import jax
import numpy as np

from podrace.sync.base import (
    ChannelClosed,
    ErrorHook,
    Publisher,
    PushTarget,
    PyTree,
    Snapshot,
    SnapshotMismatch,
    Subscriber,
    SyncError,
    SyncTimeout,
)
from podrace.sync.push import PushFanout
from podrace.sync.spec import TreeSpec
from podrace.sync.stats import RunningStat
from podrace.sync.versions import Published, VersionCounter, release_later

_log = logging.getLogger(__name__)
_names = itertools.count()


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - exercised only without ray installed
        raise ImportError("the ray weight-sync transport needs Ray: pip install 'podrace[ray]'") from exc
    return ray


class _Channel:
    __slots__ = ("version", "refs", "acks")

    def __init__(self) -> None:
        self.version: int | None = None
        self.refs: list[Any] | None = None
        self.acks: dict[str, int] = {}


class _Board:
    """Ray actor holding each channel's newest object reference; subscribers long-poll it.

    One board serves every publisher of a process and is owned by that process, so it
    dies with it: that is how subscribers learn that a publisher went away. A channel it
    does not know (never opened, or closed) reads as closed.
    """

    def __init__(self) -> None:
        self._channels: dict[str, _Channel] = {}
        self._cond: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        if self._cond is None:  # created inside the actor's event loop
            self._cond = asyncio.Condition()
        return self._cond

    async def open(self, channel: str) -> None:
        self._channels.setdefault(channel, _Channel())

    async def set(self, channel: str, version: int, refs: list[Any]) -> None:
        async with self._condition():
            state = self._channels.get(channel)
            if state is not None:
                state.version, state.refs = version, refs  # the old reference is dropped here
            self._condition().notify_all()

    async def wait(
        self, channel: str, min_version: int, timeout: float
    ) -> tuple[str, int | None, list[Any] | None]:
        """("ok", version, [ref]) once version >= min_version; ("timeout"|"closed", ...) otherwise."""
        cond = self._condition()

        def ready() -> bool:
            state = self._channels.get(channel)
            return state is None or (state.version is not None and state.version >= min_version)

        async with cond:
            try:
                await asyncio.wait_for(cond.wait_for(ready), timeout)
            except asyncio.TimeoutError:
                state = self._channels.get(channel)
                return "timeout", None if state is None else state.version, None
            state = self._channels.get(channel)
            if state is None:
                return "closed", None, None
            return "ok", state.version, state.refs

    async def close(self, channel: str) -> None:
        async with self._condition():
            self._channels.pop(channel, None)
            self._condition().notify_all()

    async def ack(self, channel: str, name: str, version: int) -> None:
        state = self._channels.get(channel)
        if state is not None:
            state.acks[name] = max(state.acks.get(name, -1), version)

    async def forget(self, channel: str, name: str) -> None:
        state = self._channels.get(channel)
        if state is not None:
            state.acks.pop(name, None)

    async def acks(self, channel: str) -> dict[str, int]:
        state = self._channels.get(channel)
        return {} if state is None else dict(state.acks)


_board_lock = threading.Lock()
_board_actor: Any = None
_boards: dict[str, Any] = {}  # this process's (node, job, worker) in a Ray session -> its board


def _process_board() -> Any:
    """This process's board actor (a new one after ray.shutdown() and ray.init())."""
    global _board_actor
    ray = _ray()
    with _board_lock:
        if _board_actor is None:
            _board_actor = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=10_000)(_Board)
        ctx = ray.get_runtime_context()
        key = f"{ctx.get_node_id()}/{ctx.get_job_id()}/{ctx.get_worker_id()}"
        if key not in _boards:
            _boards.clear()  # a handle from an earlier Ray session is useless
            _boards[key] = _board_actor.remote()
        return _boards[key]


class RayPublisher(Publisher):
    """Publishes through the Ray object store; see the module docstring.

    Needs `ray.init()` (or to run inside a Ray worker). Args as for LocalPublisher.
    """

    def __init__(
        self,
        transform: Callable[[PyTree], PyTree] | None = None,
        keep: int = 2,
        first_version: int = 0,
    ) -> None:
        ray = _ray()
        if not ray.is_initialized():
            raise SyncError("RayPublisher needs a running Ray: call ray.init() first")
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self._ray = ray
        self._transform = transform
        self.board = _process_board()
        self.channel = uuid.uuid4().hex
        ray.get(self.board.open.remote(self.channel))  # before any subscriber can ask for it
        self._refs: deque[Any] = deque(maxlen=keep)
        self._cond = threading.Condition()
        self._versions = VersionCounter(first_version)
        self._pending: Published | None = None
        self._latest: Published | None = None
        self._visible: int | None = None
        self._closed = False
        self._failure: BaseException | None = None
        self._push = PushFanout(resolve=self._host)
        self._stats = {k: RunningStat() for k in ("publish", "transform", "put", "visible")}
        self._coalesced = 0
        self._bytes = 0
        self._thread = threading.Thread(target=self._put_loop, name="podrace-ray-putter", daemon=True)
        self._thread.start()

    # -- learner side ---------------------------------------------------------------
    def publish(self, params: PyTree, *, version: int | None = None) -> int:
        start = time.perf_counter()
        with self._cond:
            if self._closed:
                raise ChannelClosed("publish() on a closed publisher")
            if self._failure is not None:
                raise SyncError("ray publisher's putter failed") from self._failure
            entry = Published(self._versions.next(version), params)
            entry.published_at = start  # type: ignore[attr-defined]
            if self._pending is not None:
                self._coalesced += 1
            if self._latest is not None:
                release_later(self._latest)
            self._pending = self._latest = entry
            self._cond.notify_all()
            self._push.offer(entry, entry.version)
        self._stats["publish"].add(time.perf_counter() - start)
        return entry.version

    def subscribe(
        self, device: Any = None, *, expect: Any = None, name: str | None = None
    ) -> "RaySubscriber":
        """A subscriber; it pickles, so pass it to Ray tasks and actors."""
        if self._closed:
            raise ChannelClosed("subscribe() on a closed publisher")
        return RaySubscriber(self.board, self.channel, device, expect=expect, name=name)

    def add_push_target(
        self, target: PushTarget, name: str, *, on_error: ErrorHook | None = None
    ) -> None:
        with self._cond:
            if self._closed:
                raise ChannelClosed("add_push_target() on a closed publisher")
            self._push.add(target, name, on_error)
            if self._latest is not None:
                self._push.offer(self._latest, self._latest.version, only=name)

    def flush(self, timeout: float | None = None) -> None:
        with self._cond:
            done = self._cond.wait_for(
                lambda: self._closed or self._failure is not None or self._visible == self._versions.latest,
                timeout,
            )
            if self._failure is not None:
                raise SyncError("ray publisher's putter failed") from self._failure
            if not done:
                raise SyncTimeout(f"flush: version {self._versions.latest} not visible within {timeout}s")

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._pending = self._latest = None
            self._cond.notify_all()
        self._thread.join(60)
        try:  # wakes every waiting subscriber with "closed" and drops the board's reference
            self._ray.get(self.board.close.remote(self.channel), timeout=10)
        except Exception:  # noqa: BLE001 - the board may already be gone
            pass
        self._refs.clear()
        self._push.close()

    @property
    def latest_version(self) -> int | None:
        return self._versions.latest

    def metrics(self) -> dict[str, float | int]:
        latest = self.latest_version
        out: dict[str, float | int] = {
            "latest_version": -1 if latest is None else latest,
            "publish/bytes": self._bytes,
            "coalesced": self._coalesced,
            "objects_alive": len(self._refs),
            "failed": int(self._failure is not None),
        }
        for key, stat in self._stats.items():
            out.update(stat.report(f"{key}/seconds"))
        if not self._closed:
            try:
                acks = self._ray.get(self.board.acks.remote(self.channel), timeout=5)
            except Exception:  # noqa: BLE001 - metrics must not raise
                acks = {}
            for name, acked in acks.items():
                out[f"subscriber/{name}/acked_version"] = acked
                out[f"subscriber/{name}/lag"] = 0 if latest is None or acked < 0 else latest - acked
        out.update(self._push.metrics())
        return out

    # -- putter thread ----------------------------------------------------------------
    def _host(self, entry: Published) -> Snapshot:
        def compute() -> Snapshot:
            params = entry.raw
            if self._transform is not None:
                start = time.perf_counter()
                params = self._transform(params)
                self._stats["transform"].add(time.perf_counter() - start)
            host = jax.tree_util.tree_map(np.asarray, jax.device_get(params))
            entry.raw = None
            return Snapshot(entry.version, host)

        return entry.derived("host", compute)

    def _put_loop(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                entry, self._pending = self._pending, None
            try:
                snapshot = self._host(entry)
                self._bytes = TreeSpec.of(snapshot.params).nbytes
                start = time.perf_counter()
                ref = self._ray.put(snapshot.params)
                self._stats["put"].add(time.perf_counter() - start)
                self._ray.get(self.board.set.remote(self.channel, entry.version, [ref]))  # a list: stays a reference
                self._refs.append(ref)
                self._stats["visible"].add(time.perf_counter() - entry.published_at)  # type: ignore[attr-defined]
                with self._cond:
                    self._visible = entry.version
                    self._cond.notify_all()
            except BaseException as exc:
                _log.error("ray publisher's putter failed; channel closed", exc_info=exc)
                with self._cond:
                    self._failure = exc
                    self._cond.notify_all()
                try:
                    self.board.close.remote(self.channel)
                except Exception:  # noqa: BLE001
                    pass
                return


def _device_key(device: Any) -> tuple[str, int] | None:
    if device is None:
        return None
    if isinstance(device, jax.Device):
        return (device.platform, device.id)
    raise TypeError("a pickled RaySubscriber can only carry a jax.Device or None")


def _device_from_key(key: tuple[str, int] | None) -> Any:
    if key is None:
        return None
    platform, dev_id = key
    return next(d for d in jax.devices(platform) if d.id == dev_id)


class RaySubscriber(Subscriber):
    """Reads a RayPublisher from any Ray worker (or the driver); see the module docstring.

    Args:
      board, channel: the publisher's `board` actor handle and `channel` id.
      device: jax Device/Sharding for the snapshots, or None for read-only NumPy arrays.
      expect: a params-like pytree or TreeSpec every snapshot must match.
      name: label in the publisher's metrics.
      long_poll: seconds one board wait may last (bounds how long close() takes).
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
        self._device = device
        self._expect = None if expect is None else TreeSpec.of(expect)
        self._long_poll = long_poll
        self._cond = threading.Condition()
        self._latest: Snapshot | None = None
        self._acked: int | None = None
        self._closed = False
        self._ended: ChannelClosed | None = None  # publisher closed or gone
        self._error: SyncError | None = None  # e.g. SnapshotMismatch of the newest version
        self._thread: threading.Thread | None = None
        self._call: Any = None
        self._transfer_time = RunningStat()

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _reattach,
            (self._board, self.channel, _device_key(self._device), self._expect, self.name, self._long_poll),
        )

    def _start(self) -> None:
        with self._cond:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._fetch_loop, name=f"podrace-ray-fetch-{self.name}", daemon=True)
                self._thread.start()

    def _fetch_loop(self) -> None:
        ray = _ray()
        last = -1
        while not self._closed:
            try:
                self._call = self._board.wait.remote(self.channel, last + 1, self._long_poll)
                status, version, refs = ray.get(self._call)
                if self._closed:
                    return
                if status == "timeout":
                    continue
                if status == "closed":
                    self._end(ChannelClosed(f"ray channel closed by its publisher (subscriber {self.name!r})"))
                    return
                start = time.perf_counter()
                params = ray.get(refs[0])
                if self._device is not None:
                    params = jax.block_until_ready(jax.device_put(params, self._device))
                self._transfer_time.add(time.perf_counter() - start)
            except ray.exceptions.TaskCancelledError:
                return  # close() interrupted the long poll
            except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as exc:
                if not self._closed:
                    self._end(ChannelClosed(f"ray channel: publisher went away ({type(exc).__name__})"))
                return
            except BaseException as exc:  # noqa: BLE001 - surfaced by the next poll()/get()
                self._end(ChannelClosed(f"ray subscriber {self.name!r} fetch failed: {exc!r}"))
                return
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
            last = version

    def _end(self, reason: ChannelClosed) -> None:
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
            self._board.ack.remote(self.channel, self.name, snapshot.version)  # fire and forget
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
        self._start()
        with self._cond:
            ready = lambda: (  # noqa: E731
                self._closed or self._ended is not None or self._error is not None
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

    def metrics(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {"acked_version": -1 if self._acked is None else self._acked}
        out.update(self._transfer_time.report("transfer/seconds"))
        return out

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._latest = None
            self._cond.notify_all()
            call, self._call = self._call, None
        try:  # interrupts the long poll; the daemon fetch thread exits on its own
            if call is not None:
                _ray().cancel(call)
            self._board.forget.remote(self.channel, self.name)
        except Exception:  # noqa: BLE001 - finished already, or the board is gone
            pass


def _reattach(
    board: Any, channel: str, device: Any, expect: Any, name: str, long_poll: float
) -> RaySubscriber:
    return RaySubscriber(board, channel, _device_from_key(device), expect=expect, name=name, long_poll=long_poll)
