"""A Ray worker process: one actor (the same loop a thread runs) with its own envs and CPU.

The learner's process creates one `RolloutWorker` Ray actor per worker id (and a new one
per restart). Inside, the actor loop runs in a thread of its own under a transfer guard,
pulls weights through the `ray` weight-sync transport (from its node's relay, when there is
one: `podrace.runtime.ray.relays`), and hands each rollout to an `Outbox`: the worker side
of the Ray sink, which copies the rollout to host arrays and holds at most `queue_size` of
them. The learner keeps one `next()` call waiting on every worker, so a finished rollout
leaves the worker at once, and nothing piles up in the object store. The first error of the
loop (an env that raised, a hang the worker's watchdog saw) is raised by the next `next()`
call, after the rollouts finished before it.

What bounds the rollouts a worker makes ahead is the data order's: in the fixed order the
actor's own rule (rollout seq waits for params seq - max_policy_lag); in the elastic order
credits (`Credits`): the learner grants each rollout, naming the oldest params it may act
with (`podrace.runtime.ray.elastic.ElasticPipeline`).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from podrace.actor import Actor, ActorSettings, make_policy_fns
from podrace.algos.normalizer import acting_apply
from podrace.config import TrainConfig
from podrace.control import Control, Lifetime, Stopped, Watchdog
from podrace.envs import EnvSource
from podrace.networks import make_network
from podrace.pipeline import BoundedQueue
from podrace.runtime.build import env_seed, seed_key
from podrace.sync.base import Snapshot, Subscriber
from podrace.sync.ray_transport import RaySubscriber
from podrace.types import EnvSpec, Rollout

UNBOUNDED_LAG = 2**62
"""The actor's own lag rule switched off: in the elastic order credits bound the lag."""


def worker_seeds(seed: int, worker_id: int, restart: int) -> tuple[jax.Array, int]:
    """(policy key, env seed) of worker `worker_id` after `restart` restarts.

    Restart 0 uses exactly the seeds of thread actor `worker_id`; every restart gets fresh
    ones, derived from (run seed, worker id, restart count) only.
    """
    if restart == 0:
        return seed_key(seed, 2, worker_id), env_seed(seed, 0, worker_id)
    env = int(
        np.random.SeedSequence([seed, 0, worker_id, restart]).generate_state(1)[0] & 0x7FFFFFFF
    )
    return jax.random.fold_in(seed_key(seed, 2, worker_id), restart), env


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to build its actor; it pickles to any node."""

    cfg: TrainConfig
    env_spec: EnvSpec
    worker_id: int
    restart: int
    first_seq: int
    """The next rollout the learner expects from this worker (0, or where the last one died)."""
    board: Any
    """The RayPublisher's board actor and channel: the worker subscribes to them itself."""
    channel: str
    envs: EnvSource
    """Where the worker's envs come from (an env id, or the user's env factory)."""
    elastic: bool = False
    """The elastic data order: a rollout starts only with a credit the learner granted."""
    relay: str | None = None
    """Name prefix of the per-node weight relays (None: read the learner's board directly);
    a node without a relay yet reads the learner's board."""


@dataclass(frozen=True)
class Shipment:
    """One rollout (host arrays) and what the worker recorded since the last shipment."""

    rollout: Rollout
    produced_until: int
    """One past the last seq this worker has finished (first_seq + rollouts finished)."""
    records: list[dict[str, float]]
    fetched: tuple[int, ...] = ()
    """Weight versions this worker pulled from the learner's board since the last shipment
    (none when it reads its node's relay)."""


class Outbox:
    """The worker side of the Ray sink: host copies of rollouts, at most `capacity` held."""

    def __init__(self, capacity: int, lifetime: Lifetime, restart: int):
        self.queue: BoundedQueue[Rollout] = BoundedQueue(capacity, lifetime)
        self.restart = restart
        self.produced = 0

    def put(self, rollout: Rollout) -> float:
        start = time.perf_counter()
        host = jax.device_get(rollout.trajectory)  # explicit device->host: ships to any node
        rollout = dataclasses.replace(rollout, trajectory=host, restart=self.restart)
        rollout.timings["to_host"] = time.perf_counter() - start
        waited = self.queue.put(rollout)
        self.produced += 1
        return waited

    def get(self) -> Rollout:
        return self.queue.get()[0]


class Credits:
    """The worker's side of the elastic order's credits: the floor (oldest params version)
    of every rollout the learner has let it start and it has not started yet."""

    def __init__(self, lifetime: Lifetime):
        self._floors: list[int] = []
        self._cond = threading.Condition()
        self._lifetime = lifetime
        lifetime.notify_on_stop(self._cond)

    def grant(self, count: int, floor: int) -> None:
        with self._cond:
            self._floors.extend([floor] * count)
            self._floors.sort()  # grants may arrive out of order: the oldest floor first
            self._cond.notify_all()

    def take(self) -> int:
        """The floor of the next rollout; waits for a credit."""
        with self._cond:
            while not self._floors:
                self._lifetime.check()
                self._cond.wait()
            return self._floors.pop(0)


class CreditedParams(Subscriber):
    """What an elastic worker's actor reads its params from: before each rollout the actor
    asks once (`get` for the first, `poll` after), and each ask takes a credit (waiting for
    one: this is where the learner holds a worker back) and returns params at least as new as
    its floor, or the newest there are. The actor's own lag rule is off (`UNBOUNDED_LAG`)."""

    def __init__(self, inner: Subscriber, credits: Credits, timeout: float, record):
        self.inner, self.credits, self.timeout, self.record = inner, credits, timeout, record
        self._latest: Snapshot | None = None
        self._given: Snapshot | None = None

    def _next(self) -> Snapshot:
        start = time.perf_counter()
        floor = self.credits.take()
        waited = time.perf_counter() - start
        newer = self.inner.poll()
        if newer is not None:
            self._latest = newer
        if self._latest is None or self._latest.version < floor:
            self._latest = self.inner.get(floor, self.timeout)
        self.record(
            {"actor/credit_wait": waited, "actor/params_wait": time.perf_counter() - start - waited}
        )
        return self._latest

    def get(self, min_version: int, timeout: float | None = None) -> Snapshot:
        self._given = self._next()
        return self._given

    def poll(self) -> Snapshot | None:
        latest = self._next()
        if latest is self._given:
            return None
        self._given = latest
        return latest

    @property
    def acked_version(self) -> int | None:
        return self.inner.acked_version

    def metrics(self) -> dict[str, float | int]:
        return self.inner.metrics()

    def close(self) -> None:
        self.inner.close()


def subscribe(spec: WorkerSpec, device: jax.Device, name: str) -> tuple[RaySubscriber, bool]:
    """(the worker's params subscriber, whether it reads its node's relay): the relay on
    this worker's node when there is one, else the learner's board."""
    import ray

    if spec.relay is not None:
        node = ray.get_runtime_context().get_node_id()
        try:
            relay = ray.get_actor(f"{spec.relay}{node}")
            board, channel = ray.get(relay.endpoint.remote(), timeout=spec.cfg.ray.start_timeout_s)
        except (ValueError, ray.exceptions.RayError):
            pass  # none on this node yet (it just joined), or it is gone: read the learner's
        else:
            return RaySubscriber(board, channel, device, name=name), True
    return RaySubscriber(spec.board, spec.channel, device, name=name), False


class RolloutWorker:
    """The body of one Ray worker process (wrapped with `ray.remote` by the runtime)."""

    def __init__(self, spec: WorkerSpec):
        cfg = spec.cfg
        self.spec = spec
        self.name = f"ray-worker-{spec.worker_id}"
        self.lifetime = lifetime = Lifetime()
        self.watchdog = Watchdog(lifetime, cfg.safety.watchdog_s)
        self._records: list[dict[str, float]] = []
        self._lock = threading.Lock()
        device = jax.devices("cpu")[0]
        # Snapshots carry the observation statistics when normalizing (see algos.normalizer).
        apply = acting_apply(make_network(cfg.network, spec.env_spec).apply, cfg.normalize)
        policy = make_policy_fns(apply).on(device)
        self.params, self.via_relay = subscribe(
            spec, device, name=f"worker-{spec.worker_id}.{spec.restart}"
        )
        first = self.params.get(0, timeout=cfg.ray.start_timeout_s)
        key, seed = worker_seeds(cfg.seed, spec.worker_id, spec.restart)
        self.credits = Credits(lifetime)
        params: Subscriber = self.params
        if spec.elastic:
            params = CreditedParams(
                self.params, self.credits, cfg.ray.start_timeout_s, self._record
            )
        settings = ActorSettings(
            actor_id=spec.worker_id,
            rollout_length=cfg.rollout_length,
            # Elastic: as many as the run takes; credits decide how many it makes.
            num_rollouts=(cfg.num_updates * cfg.num_actors if spec.elastic else cfg.num_updates)
            - spec.first_seq,
            max_policy_lag=UNBOUNDED_LAG if spec.elastic else cfg.max_policy_lag,
            key=key,
            first_seq=spec.first_seq,
        )
        env = spec.envs.make(cfg.env.num_envs, seed)
        self.outbox = Outbox(cfg.layout.queue_size, lifetime, spec.restart)
        control = Control(lifetime, self.watchdog.heartbeat(self.name), self._record)
        self.actor = Actor(settings, env, policy, params, self.outbox, control)
        self.actor.warm_up(first.params)

    def _record(self, values: Mapping[str, float]) -> None:
        with self._lock:
            self._records.append(dict(values))

    def start(self) -> tuple[str, int]:
        """Start the actor loop; returns (node id, pid) of this worker."""
        threading.Thread(target=self._run, name=self.name, daemon=True).start()
        threading.Thread(target=self.watchdog.run, name="watchdog", daemon=True).start()
        import ray

        return ray.get_runtime_context().get_node_id(), os.getpid()

    def _run(self) -> None:
        try:
            with jax.transfer_guard("disallow"):
                self.actor.run()
        except Stopped:
            pass  # the run is ending: the stop's reason is the lifetime's, nothing to report
        except BaseException as error:  # noqa: BLE001 - raised by the next next()
            self.lifetime.fail(self.name, error)

    def next(self) -> Shipment:
        """The next rollout (waits for it); the loop's error once the held rollouts are out."""
        try:
            rollout = self.outbox.get()
        except Stopped:
            failure = self.lifetime.failure
            if failure is not None:
                raise failure.error from None
            raise
        with self._lock:
            records, self._records = self._records, []
        fetched = () if self.via_relay else tuple(self.params.take_fetched())
        return Shipment(rollout, self.spec.first_seq + self.outbox.produced, records, fetched)

    def grant(self, count: int, floor: int) -> None:
        """Elastic order: let the actor start `count` more rollouts with params >= `floor`."""
        self.credits.grant(count, floor)

    def progress(self) -> tuple[int, int]:
        """(one past the last seq finished, rollouts finished and not yet taken by `next`)."""
        return self.spec.first_seq + self.outbox.produced, len(self.outbox.queue)
