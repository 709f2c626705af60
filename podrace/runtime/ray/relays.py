"""Node-local weight fan-out: one `NodeRelay` Ray actor per node that hosts workers.

A relay subscribes to the learner's channel once and republishes every version into a
channel of its own node (the sync layer's `Relay`, from a `RaySubscriber` into a
`RayPublisher` whose board and objects live on that node). The node's workers read the
relay's channel (`podrace.runtime.ray.worker.subscribe` finds it by name), so per version
one fetch leaves the learner's node for the whole node, and the workers' long polls,
acknowledgements and object lookups stay on their node. Versions keep their numbers, so
lag accounting is unchanged.

Ray's object store also moves an object to a node once, whoever reads it there; what the
relay removes is the per-worker traffic to the learner's node (one board wait, one
acknowledgement and one owner lookup per worker per version) and the learner's board
serving every worker of the cluster. `benchmarks/ray_runtime.py` measures the bytes.

Relays are owned by the learner's process (they end with it) and are placed on their node
with a hard node affinity, needing no CPU. The learner's side (`Relays`) places one on each
node that can host a worker, except the learner's own (nothing to save there), notices a
relay that ends (its node lost) and places a new one when the node is back; a worker that
starts where no relay is (yet) reads the learner's board.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from podrace.sync.ray_transport import RayPublisher, RaySubscriber
from podrace.sync.relay import Relay


def relay_prefix(channel: str) -> str:
    """Name prefix of a run's relays (the node id follows)."""
    return f"podrace-relay-{channel[:16]}-"


class NodeRelay:
    """The body of one relay actor (wrapped with `ray.remote` by `Relays`)."""

    def __init__(self, board: Any, channel: str, name: str):
        self.source = RaySubscriber(board, channel, device=None, name=name)
        self.target = RayPublisher()
        self.relay = Relay(self.source, self.target, name=name)
        self._fetched = 0
        self._done = threading.Event()
        threading.Thread(target=self._watch, name="relay-watch", daemon=True).start()

    def _watch(self) -> None:
        with contextlib.suppress(BaseException):
            self.relay.join()
        self._done.set()

    def endpoint(self) -> tuple[Any, str]:
        """(board, channel) the node's workers subscribe to."""
        return self.target.board, self.target.channel

    def wait_stopped(self) -> str | None:
        """Returns once the relay stopped: why (None: its source closed)."""
        self._done.wait()
        error = self.relay.error
        return None if error is None else f"{type(error).__name__}: {error}"

    def fetched(self) -> int:
        """Versions this relay pulled from the learner's node so far."""
        self._fetched += len(self.source.take_fetched())
        return self._fetched

    def close(self) -> None:
        self.relay.close()
        self.target.close()


class Relays:
    """The learner's side: one relay per node that can host workers."""

    def __init__(self, ray: Any, board: Any, channel: str, learner_node: str):
        self._ray = ray
        self._remote = ray.remote(NodeRelay)
        self.board, self.channel = board, channel
        self.prefix = relay_prefix(channel)
        self.learner_node = learner_node
        self.handles: dict[str, Any] = {}
        """node id -> relay actor."""
        self.fetched: dict[str, int] = {}
        """node id -> versions its relays pulled so far (every relay it had)."""
        self._counted: dict[str, int] = {}
        """node id -> what its current relay reported last."""
        self._closed = False

    def place(self, node: str) -> tuple[Any, Any] | None:
        """Place a relay on `node` unless it has one or is the learner's (whose workers read
        the learner's board without crossing the network); returns (its wait_stopped() ref,
        the handle), or None."""
        if self._closed or node in self.handles or node == self.learner_node:
            return None
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        handle = self._remote.options(
            name=f"{self.prefix}{node}",
            num_cpus=0,
            max_restarts=0,
            max_concurrency=4,  # wait_stopped() blocks one thread
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            runtime_env={"env_vars": {"JAX_PLATFORMS": "cpu"}},
        ).remote(self.board, self.channel, f"relay@{node[:8]}")
        self.handles = {**self.handles, node: handle}  # read from the metrics thread too
        self._counted[node] = 0
        return handle.wait_stopped.remote(), handle

    def ended(self, node: str, handle: Any) -> None:
        """The relay on `node` stopped (or its node is gone): forget it."""
        if self.handles.get(node) is handle:
            self.handles = {n: h for n, h in self.handles.items() if n != node}
            self._counted.pop(node, None)
            with contextlib.suppress(Exception):
                self._ray.kill(handle, no_restart=True)

    def counted(self, node: str, handle: Any, fetched: int) -> None:
        """`handle` (the relay on `node`) reported `fetched` versions pulled so far."""
        if self.handles.get(node) is not handle:
            return
        more = fetched - self._counted.get(node, 0)
        if more > 0:
            self._counted[node] = fetched
            self.fetched[node] = self.fetched.get(node, 0) + more

    def answered(self, kind: str, node: str, handle: Any, ref: Any) -> None:
        """A call on `handle`, the relay on `node`, returned `ref`: its wait_stopped()
        ("relay-stopped": the relay ended) or its fetched() ("relay-fetched": its count; an
        error: the relay is gone)."""
        try:
            value = self._ray.get(ref)
        except self._ray.exceptions.RayError:
            value = None
            self.ended(node, handle)
        if kind == "relay-stopped":
            self.ended(node, handle)
        elif value is not None:
            self.counted(node, handle, value)

    def fetches_out(self) -> int:
        """Versions pulled by relays on nodes other than the learner's."""
        fetched = list(self.fetched.items())  # read from the metrics thread too
        return sum(n for node, n in fetched if node != self.learner_node)

    def kill(self) -> None:
        """Kill every relay; none is placed after (the run is stopping)."""
        self._closed = True
        handles, self.handles = self.handles, {}
        for handle in handles.values():
            with contextlib.suppress(Exception):
                self._ray.kill(handle, no_restart=True)


class DirectFetches:
    """Versions workers pulled from the learner's board themselves (they started where no
    relay was yet), by node: each version reached its node once, as Ray moves an object to
    a node once."""

    def __init__(self, learner_node: str):
        self.learner_node = learner_node
        self.by_node: dict[str, set[int]] = {}
        self.out = 0
        """(node, version) pulls by nodes other than the learner's."""

    def add(self, node: str, versions: tuple[int, ...]) -> None:
        """A worker on `node` pulled `versions` from the learner's board."""
        if not versions or node == self.learner_node:
            return
        seen = self.by_node.setdefault(node, set())
        for version in versions:
            if version not in seen:
                seen.add(version)
                self.out += 1
        if len(seen) > 4096:  # bounded: the oldest half goes
            for version in sorted(seen)[:2048]:
                seen.discard(version)


__all__ = ["DirectFetches", "NodeRelay", "Relays", "relay_prefix"]
