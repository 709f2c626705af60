"""A fake Ray for the collector's and the relays' bookkeeping (no cluster starts).

Every `handle.method.remote(...)` is a `FakeCall` the test settles (`resolve` / `fail`);
`FakeRay.wait` returns the settled ones and `FakeRay.get` their value or error, as Ray's
`wait`/`get` do with object refs. `Worker` plays one Ray worker incarnation: its spec (what
the collector launched it with), its start, its rollouts, its death.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import numpy as np

from podrace.config import RayConfig, TrainConfig, replace
from podrace.control import Lifetime
from podrace.types import Rollout


class FakeCall:
    """What `handle.method.remote(...)` returns: an object ref stand-in, settled by tests."""

    ids = itertools.count()

    def __init__(self, name: str, args: tuple = ()):
        self.name, self.args, self.id = name, args, next(self.ids)
        self.done, self.value, self.error = False, None, None

    def resolve(self, value: Any = None) -> None:
        self.done, self.value = True, value

    def fail(self, error: BaseException) -> None:
        self.done, self.error = True, error


class FakeHandle:
    """A Ray actor handle: every attribute is a method whose `.remote` records a call."""

    def __init__(self, *args: Any):
        self.args = args
        self.calls: list[FakeCall] = []
        self.killed = False

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)

        def remote(*args: Any) -> FakeCall:
            self.calls.append(FakeCall(name, args))
            return self.calls[-1]

        return SimpleNamespace(remote=remote)

    def pending(self, name: str) -> list[FakeCall]:
        """Calls of `name` not settled yet."""
        return [c for c in self.calls if c.name == name and not c.done]


class FakeRemote:
    """`ray.remote(cls)`: `.options(...).remote(*args)` launches a FakeHandle."""

    def __init__(self):
        self.launched: list[FakeHandle] = []

    def options(self, **_: Any) -> FakeRemote:
        return self

    def remote(self, *args: Any) -> FakeHandle:
        self.launched.append(FakeHandle(*args))
        return self.launched[-1]


class FakeRay:
    """The parts of the `ray` module the collector and the relays use."""

    def __init__(self, nodes: list[dict] | None = None, node_id: str = "head"):
        import ray

        self.exceptions = ray.exceptions
        self._nodes = nodes if nodes is not None else []
        self._node_id = node_id

    def nodes(self) -> list[dict]:
        return self._nodes

    def kill(self, handle: FakeHandle, no_restart: bool = True) -> None:
        handle.killed = True

    def remote(self, cls: Any) -> FakeRemote:
        return FakeRemote()

    def get_runtime_context(self) -> Any:
        return SimpleNamespace(get_node_id=lambda: self._node_id)

    def wait(self, refs: list[FakeCall], num_returns: int = 1, timeout: float | None = None):
        ready = [r for r in refs if r.done][:num_returns]
        return ready, [r for r in refs if r not in ready]

    def get(self, ref: FakeCall, timeout: float | None = None) -> Any:
        assert ref.done, f"ray.get of an unsettled {ref.name} call would block"
        if ref.error is not None:
            raise ref.error
        return ref.value


def node(node_id: str, cpus: float, alive: bool = True) -> dict:
    return {"NodeID": node_id, "Alive": alive, "Resources": {"CPU": cpus}}


class FakeMetrics:
    """Counters and values as the run's Metrics takes them."""

    def __init__(self):
        self.counts: dict[str, float] = {}

    def count(self, key: str, n: float = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def total(self, key: str) -> float:
        return self.counts.get(key, 0)

    def add(self, key: str, value: float) -> None:
        pass

    def add_many(self, values: dict) -> None:
        pass


def fake_run(pipeline: Any = None, changes: dict | None = None, **ray_cfg: Any) -> Any:
    """A run as the collector and the data orders see it: config (`ray_cfg`, then the
    dotted `changes`), lifetime, metrics, `pipeline`; placement leaves arrays as they are."""
    import jax

    cfg = replace(TrainConfig(runtime="ray", ray=RayConfig(**ray_cfg)), **(changes or {}))
    return SimpleNamespace(
        cfg=cfg,
        lifetime=Lifetime(),
        metrics=FakeMetrics(),
        placement=SimpleNamespace(place=lambda x: x),
        devices=SimpleNamespace(learners=jax.devices("cpu")),
        pipeline=pipeline,
    )


def worker_spec(slot: Any) -> Any:
    """What the collector launches an incarnation with (the fields the fakes read)."""
    return SimpleNamespace(worker_id=slot.worker_id, restart=slot.restarts, first_seq=slot.next_seq)


def make_collector(run: Any, order: Any, fake: FakeRay, relays: Any = None, elastic: bool = True):
    """A Collector over `fake` Ray; returns (collector, the FakeRemote its workers come from)."""
    from podrace.runtime.ray.collector import Collector

    remote = FakeRemote()
    collector = Collector(fake, run, remote, worker_spec, order, relays, elastic)
    return collector, remote


def rollout(actor_id: int, seq: int, version: int, restart: int) -> Rollout:
    return Rollout(
        actor_id,
        seq,
        version,
        np.zeros(1, np.float32),
        np.zeros(0),
        np.zeros(0),
        {"to_learner": 0.0},
        restart=restart,
    )


class Worker:
    """One incarnation of a Ray worker as the collector launched it (a FakeHandle)."""

    def __init__(self, handle: FakeHandle):
        self.handle = handle
        self.spec = handle.args[0]
        self.made = 0

    @property
    def next_seq(self) -> int:
        return self.spec.first_seq + self.made

    @property
    def credits(self) -> int:
        """Elastic order: rollouts the learner let it make and it has not made."""
        granted = sum(c.args[0] for c in self.handle.calls if c.name == "grant")
        return granted - self.made

    def start(self, node_id: str = "head", pid: int = 1) -> None:
        (call,) = self.handle.pending("start")
        call.resolve((node_id, pid))

    def die_starting(self) -> None:
        (call,) = self.handle.pending("start")
        call.fail(_died())

    def deliver(self, version: int = 0, fetched: tuple[int, ...] = ()) -> int:
        """Answer the waiting next() with this incarnation's next rollout; returns its seq."""
        from podrace.runtime.ray.worker import Shipment

        (call,) = self.handle.pending("next")
        seq = self.next_seq
        self.made += 1
        made = rollout(self.spec.worker_id, seq, version, self.spec.restart)
        call.resolve(Shipment(made, self.next_seq, [], fetched))
        return seq

    def die(self) -> None:
        """Its process is killed: the waiting next() fails as Ray reports a dead actor."""
        for call in self.handle.pending("next"):
            call.fail(_died())


def _died() -> BaseException:
    import ray

    return ray.exceptions.ActorDiedError()


__all__ = [
    "FakeCall",
    "FakeHandle",
    "FakeMetrics",
    "FakeRay",
    "FakeRemote",
    "Worker",
    "fake_run",
    "make_collector",
    "node",
    "rollout",
    "worker_spec",
]
