"""The board of the `ray` transport (see `Board`): one async Ray actor per publishing
process, which subscribers long-poll for each channel's newest object reference."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any


def ray_module() -> Any:
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - exercised only without ray installed
        raise ImportError(
            "the ray weight-sync transport needs Ray: pip install 'podrace[ray]'"
        ) from exc
    return ray


def connected() -> bool:
    """This process is connected to Ray. Checked before every call a finalizer or a
    background thread makes: after `ray.shutdown()` any Ray call would auto-start a new
    local Ray (daemons and all) in the user's process, with nobody to stop it."""
    return ray_module().is_initialized()


class Channel:
    """A channel's newest reference and its subscribers' acknowledgements. Subscribers are
    keyed by an id of their own (each copy of a pickled subscriber has one) and reported by
    their name, or `name#2`, `name#3`... while another live subscriber has it (as the shm
    doorbell does)."""

    __slots__ = ("version", "refs", "acks", "alive_until", "labels")

    def __init__(self) -> None:
        self.version: int | None = None
        self.refs: list[Any] | None = None
        self.acks: dict[str, int] = {}  # subscriber id -> highest acknowledged version
        self.alive_until: dict[str, float] = {}  # subscriber id -> when its next wait is overdue
        self.labels: dict[str, str] = {}  # subscriber id -> its name in the publisher's metrics

    def heard_from(self, subscriber: str, name: str, grace: float) -> None:
        if subscriber not in self.labels:
            taken = set(self.labels.values())
            label, n = name, 1
            while label in taken:
                n += 1
                label = f"{name}#{n}"
            self.labels[subscriber] = label
        self.alive_until[subscriber] = max(
            self.alive_until.get(subscriber, 0.0), time.monotonic() + grace
        )

    def forget(self, subscriber: str) -> None:
        self.acks.pop(subscriber, None)
        self.alive_until.pop(subscriber, None)
        self.labels.pop(subscriber, None)

    def drop_silent(self) -> None:
        """Forget subscribers overdue for their next wait: their process died (as on shm,
        where the doorbell's socket closes, a dead subscriber is no longer reported)."""
        now = time.monotonic()
        for subscriber in [s for s, until in self.alive_until.items() if until < now]:
            self.forget(subscriber)

    def reported_acks(self) -> dict[str, int]:
        return {self.labels[s]: version for s, version in self.acks.items()}


class Board:
    """Ray actor holding each channel's newest object reference; subscribers long-poll it.

    One board serves every publisher of a process and is owned by that process, so it
    dies with it: that is how subscribers learn that a publisher went away. A channel it
    does not know (never opened, or closed) reads as closed. Each wait is also a
    subscriber's heartbeat: one that stops waiting for longer than its `grace` is dropped
    from the acknowledged versions.
    """

    def __init__(self) -> None:
        self._channels: dict[str, Channel] = {}
        self._errors: dict[str, str] = {}  # channels closed with an error: why
        self._cond: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        if self._cond is None:  # created inside the actor's event loop
            self._cond = asyncio.Condition()
        return self._cond

    async def open(self, channel: str) -> None:
        self._channels.setdefault(channel, Channel())

    async def set(self, channel: str, version: int, refs: list[Any]) -> None:
        async with self._condition():
            state = self._channels.get(channel)
            if state is not None:
                state.version, state.refs = version, refs  # the old reference is dropped here
            self._condition().notify_all()

    async def wait(
        self,
        channel: str,
        min_version: int,
        timeout: float,
        subscriber: str = "",
        name: str = "",
        grace: float = 0.0,
    ) -> tuple[str, int | None, Any]:
        """("ok", version, [ref]) once version >= min_version; ("timeout", latest, None) or
        ("closed", None, error or None) otherwise. A `subscriber` id (with its `name`) makes
        the wait that subscriber's heartbeat."""
        cond = self._condition()
        state = self._channels.get(channel)
        if state is not None and subscriber:
            state.heard_from(subscriber, name, timeout + grace)

        def ready() -> bool:
            state = self._channels.get(channel)
            return state is None or (state.version is not None and state.version >= min_version)

        async with cond:
            try:
                await asyncio.wait_for(cond.wait_for(ready), timeout)
            except TimeoutError:
                state = self._channels.get(channel)
                return "timeout", None if state is None else state.version, None
            state = self._channels.get(channel)
            if state is None:
                return "closed", None, self._errors.get(channel)
            if subscriber:
                state.heard_from(subscriber, name, grace)
            return "ok", state.version, state.refs

    async def close(self, channel: str, error: str | None = None) -> None:
        async with self._condition():
            if error is not None and channel in self._channels:
                self._errors[channel] = error
            self._channels.pop(channel, None)
            self._condition().notify_all()

    async def ack(
        self, channel: str, subscriber: str, name: str, version: int, grace: float = 60.0
    ) -> None:
        state = self._channels.get(channel)
        if state is not None:
            state.heard_from(subscriber, name, grace)
            state.acks[subscriber] = max(state.acks.get(subscriber, -1), version)

    async def forget(self, channel: str, subscriber: str) -> None:
        state = self._channels.get(channel)
        if state is not None:
            state.forget(subscriber)

    async def acks(self, channel: str) -> dict[str, int]:
        state = self._channels.get(channel)
        if state is None:
            return {}
        state.drop_silent()
        return state.reported_acks()


_board_lock = threading.Lock()
_board_actor: Any = None
_boards: dict[str, Any] = {}  # this process's (node, job, worker) in a Ray session -> its board


def process_board() -> Any:
    """This process's board actor (a new one after ray.shutdown() and ray.init()), on this
    process's node: its subscribers' waits and acknowledgements then reach the publisher's
    node and no other (a relay's board serves the workers of its own node)."""
    global _board_actor
    ray = ray_module()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    with _board_lock:
        if _board_actor is None:
            _board_actor = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=10_000)(Board)
        ctx = ray.get_runtime_context()
        key = f"{ctx.get_node_id()}/{ctx.get_job_id()}/{ctx.get_worker_id()}"
        if key not in _boards:
            _boards.clear()  # a handle from an earlier Ray session is useless
            here = NodeAffinitySchedulingStrategy(ctx.get_node_id(), soft=False)
            _boards[key] = _board_actor.options(scheduling_strategy=here).remote()
        return _boards[key]
