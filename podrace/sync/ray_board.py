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
        raise ImportError("the ray weight-sync transport needs Ray: pip install 'podrace[ray]'") from exc
    return ray


def connected() -> bool:
    """This process is connected to Ray. Checked before every call a finalizer or a
    background thread makes: after `ray.shutdown()` any Ray call would auto-start a new
    local Ray (daemons and all) in the user's process, with nobody to stop it."""
    return ray_module().is_initialized()


class Channel:
    __slots__ = ("version", "refs", "acks", "alive_until")

    def __init__(self) -> None:
        self.version: int | None = None
        self.refs: list[Any] | None = None
        self.acks: dict[str, int] = {}
        self.alive_until: dict[str, float] = {}  # subscriber -> when its next wait is overdue

    def heard_from(self, name: str, grace: float) -> None:
        self.alive_until[name] = max(self.alive_until.get(name, 0.0), time.monotonic() + grace)

    def drop_silent(self) -> None:
        """Forget subscribers overdue for their next wait: their process died (as on shm,
        where the doorbell's socket closes, a dead subscriber is no longer reported)."""
        now = time.monotonic()
        for name in [n for n, until in self.alive_until.items() if until < now]:
            del self.alive_until[name]
            self.acks.pop(name, None)


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
        self, channel: str, min_version: int, timeout: float, name: str = "", grace: float = 0.0
    ) -> tuple[str, int | None, Any]:
        """("ok", version, [ref]) once version >= min_version; ("timeout", latest, None) or
        ("closed", None, error or None) otherwise."""
        cond = self._condition()
        state = self._channels.get(channel)
        if state is not None and name:
            state.heard_from(name, timeout + grace)

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
                return "closed", None, self._errors.get(channel)
            if name:
                state.heard_from(name, grace)
            return "ok", state.version, state.refs

    async def close(self, channel: str, error: str | None = None) -> None:
        async with self._condition():
            if error is not None and channel in self._channels:
                self._errors[channel] = error
            self._channels.pop(channel, None)
            self._condition().notify_all()

    async def ack(self, channel: str, name: str, version: int, grace: float = 60.0) -> None:
        state = self._channels.get(channel)
        if state is not None:
            state.acks[name] = max(state.acks.get(name, -1), version)
            state.heard_from(name, grace)

    async def forget(self, channel: str, name: str) -> None:
        state = self._channels.get(channel)
        if state is not None:
            state.acks.pop(name, None)
            state.alive_until.pop(name, None)

    async def acks(self, channel: str) -> dict[str, int]:
        state = self._channels.get(channel)
        if state is None:
            return {}
        state.drop_silent()
        return dict(state.acks)


_board_lock = threading.Lock()
_board_actor: Any = None
_boards: dict[str, Any] = {}  # this process's (node, job, worker) in a Ray session -> its board


def process_board() -> Any:
    """This process's board actor (a new one after ray.shutdown() and ray.init())."""
    global _board_actor
    ray = ray_module()
    with _board_lock:
        if _board_actor is None:
            _board_actor = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=10_000)(Board)
        ctx = ray.get_runtime_context()
        key = f"{ctx.get_node_id()}/{ctx.get_job_id()}/{ctx.get_worker_id()}"
        if key not in _boards:
            _boards.clear()  # a handle from an earlier Ray session is useless
            _boards[key] = _board_actor.remote()
        return _boards[key]
