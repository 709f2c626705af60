"""A Ray worker process: one actor (the same loop a thread runs) with its own envs and CPU.

The learner's process creates one `RolloutWorker` Ray actor per worker id (and a new one
per restart). Inside, the actor loop runs in a thread of its own under a transfer guard,
pulls weights through the `ray` weight-sync transport, and hands each rollout to an
`Outbox`: the worker side of the Ray sink, which copies the rollout to host arrays and
holds at most `queue_size` of them. The learner pulls them one at a time with `next()`,
so a worker never has more than `queue_size + 1` rollouts in flight and nothing piles up
in the object store. The first error of the loop (an env that raised, a hang the worker's
watchdog saw) is raised by the next `next()` call, after the rollouts finished before it.
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
from podrace.sync.ray_transport import RaySubscriber
from podrace.types import EnvSpec, Rollout


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


@dataclass(frozen=True)
class Shipment:
    """One rollout (host arrays) and what the worker recorded since the last shipment."""

    rollout: Rollout
    produced_until: int
    """One past the last seq this worker has finished (first_seq + rollouts finished)."""
    records: list[dict[str, float]]


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
        self.params = RaySubscriber(
            spec.board, spec.channel, device, name=f"worker-{spec.worker_id}.{spec.restart}"
        )
        first = self.params.get(0, timeout=cfg.ray.start_timeout_s)
        key, seed = worker_seeds(cfg.seed, spec.worker_id, spec.restart)
        settings = ActorSettings(
            actor_id=spec.worker_id,
            rollout_length=cfg.rollout_length,
            num_rollouts=cfg.num_updates - spec.first_seq,
            max_policy_lag=cfg.max_policy_lag,
            key=key,
            first_seq=spec.first_seq,
        )
        env = spec.envs.make(cfg.env.num_envs, seed)
        self.outbox = Outbox(cfg.layout.queue_size, lifetime, spec.restart)
        control = Control(lifetime, self.watchdog.heartbeat(self.name), self._record)
        self.actor = Actor(settings, env, policy, self.params, self.outbox, control)
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
        return Shipment(rollout, self.spec.first_seq + self.outbox.produced, records)
