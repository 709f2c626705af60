"""The Ray topology: actors as Ray workers on any node, the learner and evaluator here.

`join` starts (or joins) Ray. The learner publishes through the `ray` weight-sync
transport, which reaches each node's workers through a relay on that node
(`podrace.runtime.ray.relays`; `--ray.no-node-relay`: every worker reads the learner's
board). `launch_actors` starts one `RolloutWorker` per worker id (each compiles its policy
while the learner compiles) and `actors_ready` waits for them. One thread of this process,
the collector (`podrace.runtime.ray.collector`), makes every Ray call on the workers: it
receives each rollout as soon as its worker finishes it, and restarts a worker that dies
(process killed, node lost, its loop raised) with fresh seeds (run seed, worker id, restart
count). Every consumed rollout is stamped (worker, restart, seq) (`RayReport.stamps`); a
worker that fails more than `ray.max_restarts` times stops the run with its last error.

Two data orders (`--ray.data-order`):

- fixed: update k consumes rollout seq k of every worker, in worker order, as in the thread
  topology. One pump thread per worker places its rollouts on the learner mesh, in seq
  order, and queues them in the same per-actor pipeline. A replacement worker starts at the
  seq after the last one received, so the slot is filled by the new incarnation and no seq
  is consumed twice; the learner waits for it.
- elastic: each update consumes the first `ray.rollouts_per_update` rollouts to arrive from
  any workers, within the lag bound (`podrace.pipeline.ElasticPipeline`, which also grants
  the credits that bound what each worker makes). A lost worker costs its in-flight
  rollouts, which other workers make instead; it restarts in the background, and waits for
  resources when its node is gone; `--ray.num-workers auto` adds workers as nodes join.

Checkpoints keep every worker's next seq and restart count (fixed), or the highest restart
count of any worker (elastic). A resumed run starts every worker as a new incarnation
(fresh seeds, new stamps): fixed at the checkpoint's next seqs, so data order and "nothing
consumed twice" hold across the resume; elastic from the learner's state alone (rollouts in
flight at the stop are not in the checkpoint), every worker beyond every restart before.
In the fixed order the worker count is part of what a checkpoint holds (the batch is one
rollout per worker); in both, the batch of an update is.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from podrace.checkpoints.state import RunState
from podrace.config import ConfigError, TrainConfig
from podrace.envs.source import EnvSource
from podrace.pipeline import ElasticPipeline, PlacingSink
from podrace.runtime.build import dummy_trajectory
from podrace.runtime.ray import cluster as ray_cluster
from podrace.runtime.ray.collector import (
    Collector,
    NoWorkers,
    Slot,
    WorkerCrashLoop,
    WorkerNotReady,
    worker_capacity,
)
from podrace.runtime.ray.relays import Relays
from podrace.runtime.ray.worker import RolloutWorker, Shipment, WorkerSpec, worker_seeds
from podrace.runtime.topology import Topology
from podrace.types import Rollout


@dataclass(frozen=True)
class RayReport:
    """What a Ray run adds to its TrainResult. The counts are the run's (`ray/*` totals):
    a resumed run's include those before its checkpoint; the stamps are this part's."""

    restarts: int = 0
    lost_rollouts: int = 0
    """Rollouts a worker finished that never reached the learner's process."""
    stamps: tuple[tuple[int, int, int], ...] = ()
    """(worker, restart, seq) of every consumed rollout: in the order the learner took them
    (fixed order), or sorted (elastic order)."""
    worker_nodes: tuple[str, ...] = ()
    """Ray node id each worker ran on last."""
    object_store_bytes: int = 0
    """Object-store bytes in use at the last metrics line before the run stopped, or at its
    start (the workers alive either way)."""
    data_order: str = "fixed"
    dropped_rollouts: int = 0
    """Elastic order: rollouts dropped as over the lag bound."""
    lost_credits: int = 0
    """Elastic order: rollouts lost workers were making (or about to make), made by others."""
    weight_bytes_out: int = 0
    """Param bytes that left the learner's node: one copy per version per other node."""


class FixedOrder:
    """Update k takes rollout k of every worker: each worker's rollouts wait in its inbox
    until its pump thread places them and queues them for the learner, in seq order."""

    def __init__(self, topology: RayTopology, run: Any):
        self.topology, self.run = topology, run
        self.last = run.cfg.num_updates
        self.inboxes: dict[int, collections.deque[Rollout]] = {}
        self._cond = threading.Condition()
        run.lifetime.notify_on_stop(self._cond)

    def started(self, slot: Slot) -> None:
        pass

    def wanted(self, slot: Slot) -> bool:
        return slot.next_seq < self.last

    def received(self, slot: Slot, shipment: Shipment) -> None:
        with self._cond:
            self.inboxes.setdefault(slot.worker_id, collections.deque()).append(shipment.rollout)
            self._cond.notify_all()

    def lost(self, slot: Slot) -> None:
        pass

    def pump(self, worker_id: int, first: int) -> None:
        """Place worker `worker_id`'s rollouts `first`.. on the learner mesh and queue them."""
        run, sink = self.run, self.topology.sink
        for _ in range(first, self.last):
            with self._cond:
                inbox = self.inboxes.setdefault(worker_id, collections.deque())
                while not inbox:
                    run.lifetime.check()
                    self._cond.wait()
                rollout = inbox.popleft()
            sink.put(rollout)  # placed on the learner mesh, then queued (may wait)
            run.metrics.add("actor/to_learner", rollout.timings["to_learner"])


class ElasticOrder:
    """Rollouts go to the elastic pipeline as they arrive, placed by the collector."""

    def __init__(self, topology: RayTopology, run: Any):
        self.topology, self.run = topology, run
        self.pipeline: ElasticPipeline = run.pipeline

    def started(self, slot: Slot) -> None:
        self.pipeline.join(slot.key)

    def wanted(self, slot: Slot) -> bool:
        return True

    def received(self, slot: Slot, shipment: Shipment) -> None:
        run = self.run
        rollout = shipment.rollout
        start = time.perf_counter()
        placed = run.placement.place(jax.device_put(rollout.trajectory, run.devices.learners[0]))
        jax.block_until_ready(placed)
        rollout.timings["to_learner"] = time.perf_counter() - start
        run.metrics.add("actor/to_learner", rollout.timings["to_learner"])
        if not self.pipeline.deliver(slot.key, dataclasses.replace(rollout, trajectory=placed)):
            run.metrics.count("ray/dropped_rollouts")

    def lost(self, slot: Slot) -> None:
        self.run.metrics.count("ray/lost_credits", self.pipeline.lose(slot.key))

    def refresh(self) -> float | None:
        return self.pipeline.refresh()


class RayTopology(Topology):
    name = "ray"
    stop_grace_s = 10.0  # killing workers wakes the collector and the pumps
    exit_grace_s = 30.0  # killing workers and stopping a local Ray take seconds

    def __init__(self) -> None:
        self.start_keys: np.ndarray | None = None
        self.collector: Collector | None = None
        self.order: FixedOrder | ElasticOrder | None = None
        self._stack = contextlib.ExitStack()
        self._ray: Any = None
        self._run: Any = None
        self._remote: Any = None
        self.cluster: ray_cluster.Cluster | None = None
        self._store_in_use = -1
        self._slots: list[Slot] = []
        self._params_bytes = 0
        self._first_version = 0
        self._base_restart = 0

    @property
    def slots(self) -> list[Slot]:
        return self.collector.slots if self.collector is not None else self._slots

    @staticmethod
    def elastic(cfg: TrainConfig) -> bool:
        return cfg.ray.data_order == "elastic"

    # Preparing ---------------------------------------------------------------------------
    def check(self, cfg: TrainConfig) -> None:
        # Ray's C++ crash handler also catches SIGTERM and re-raises it after podrace's,
        # which made one SIGTERM look like two; crash stack traces stay in Ray's logs.
        os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
        ray_cluster.import_ray()  # a missing Ray is a one-line error before JAX starts
        ray_cluster.check_auth_not_disabled()

    def check_envs(self, envs: EnvSource) -> None:
        ray_cluster.check_envs_sendable(envs)

    def join(self, cfg: TrainConfig, lifetime, resuming: bool) -> TrainConfig:
        import ray

        self._ray = ray
        lifetime.check()
        self.cluster = self._stack.enter_context(
            ray_cluster.connect(cfg.ray, num_cpus=ray_cluster.local_cpus(cfg.ray))
        )
        self._remote = ray.remote(RolloutWorker)
        lifetime.on_stop(self._kill_workers)  # wakes every wait on a worker, starting too
        return cfg

    def publisher(self, run, first_version: int):
        from podrace.sync.ray_transport import RayPublisher

        self._first_version = first_version
        return RayPublisher(first_version=first_version)

    def published(self, params: Any) -> Any:
        return jax.device_get(params)  # as the ray transport delivers

    def pipeline(self, run, first_seq: int):
        cfg = run.cfg
        if not self.elastic(cfg):
            return super().pipeline(run, first_seq)
        return ElasticPipeline(
            cfg.num_actors,
            cfg.max_policy_lag,
            run.lifetime,
            first_version=first_seq,
            grant=self._grant,
        )

    def _grant(self, grants) -> None:
        if self.collector is not None:
            self.collector.grant(grants)

    def learner_dummies(self, run) -> list:
        # Placed from the host, as the workers' rollouts arrive (same shardings).
        first = run.devices.learners[0]
        placed = run.placement.place(jax.device_get(dummy_trajectory(run.cfg, run.spec, first)))
        return [placed] * run.cfg.num_actors

    def saved_actors(self, run) -> int:
        return run.cfg.num_actors

    def actors_start(self, run, restored: RunState | None) -> dict:
        cfg = run.cfg
        n = self._initial_workers(cfg)
        if self.elastic(cfg):
            # Every worker of a resumed run is beyond every incarnation before it: fresh
            # seeds, new stamps; it continues from the learner's state alone.
            base = 0 if restored is None else max(restored.actor_restarts or (0,)) + 1
            self._slots = [Slot(i, restarts=base, first_restart=base) for i in range(n)]
            keys = [worker_seeds(cfg.seed, i, 0)[0] for i in range(cfg.num_actors)]
            self._base_restart = base
        elif restored is None:
            self._slots = [Slot(i) for i in range(n)]
            keys = [worker_seeds(cfg.seed, i, 0)[0] for i in range(n)]
        else:
            version = restored.version
            if tuple(restored.actor_next_seq) != (version,) * n:
                raise ConfigError(
                    f"checkpoint {version} has workers' next rollouts "
                    f"{list(restored.actor_next_seq)}; the fixed data order resumes only where "
                    f"every worker continues at {version}"
                )
            restarts = restored.actor_restarts or (0,) * n
            # Every worker of a resumed run is a new incarnation: fresh seeds, new stamps.
            self._slots = [
                Slot(i, restarts=restarts[i] + 1, first_restart=restarts[i] + 1, next_seq=version)
                for i in range(n)
            ]
            keys = list(restored.actor_keys)
        self.start_keys = np.stack([np.asarray(jax.device_get(k)) for k in keys])
        for slot in self._slots:
            run.metrics.count(f"ray/worker-{slot.worker_id}/restarts", 0)
        for name in ("ray/restarts", "ray/lost_rollouts", "ray/joins"):
            run.metrics.count(name, 0)
        if self.elastic(cfg):
            for name in ("ray/dropped_rollouts", "ray/lost_credits"):
                run.metrics.count(name, 0)
        return self.actors_saved(run, run.learner.version if restored is None else restored.version)

    def _initial_workers(self, cfg: TrainConfig) -> int:
        """Workers launched at the start: the number asked for, or (auto) as many as the
        cluster holds now, at least one."""
        if cfg.ray.num_workers != "auto":
            return cfg.ray.num_workers
        fits = sum(worker_capacity(self._ray, cfg).values())
        if cfg.ray.max_workers is not None:
            fits = min(fits, cfg.ray.max_workers)
        return max(1, fits)

    def actors_saved(self, run, version: int) -> dict:
        slots = self.slots
        if self.elastic(run.cfg):
            n = run.cfg.num_actors
            highest = max((slot.restarts for slot in slots), default=0)
            return {
                "actor_keys": self.start_keys,
                "actor_next_seq": (0,) * n,
                "actor_restarts": (highest,) * n,
            }
        return {
            "actor_keys": self.start_keys,
            "actor_next_seq": (version,) * len(slots),
            "actor_restarts": tuple(slot.restarts for slot in slots),
        }

    def launch_actors(self, run) -> None:
        self._run = run
        self.cluster.messages.attach(run.run_dir)
        cfg = run.cfg
        self._params_bytes = sum(np.asarray(x).nbytes for x in jax.tree.leaves(run.published))
        board, channel = run.publisher.board, run.publisher.channel
        relays = None
        if cfg.ray.node_relay:
            node = self._ray.get_runtime_context().get_node_id()
            relays = Relays(self._ray, board, channel, node)
        elastic = self.elastic(cfg)
        self.order = ElasticOrder(self, run) if elastic else FixedOrder(self, run)

        def spec(slot: Slot) -> WorkerSpec:
            return WorkerSpec(
                cfg,
                run.spec,
                slot.worker_id,
                slot.restarts,
                slot.next_seq,
                board,
                channel,
                run.envs,
                elastic=elastic,
                relay=relays.prefix if relays is not None else None,
            )

        collector = Collector(self._ray, run, self._remote, spec, self.order, relays, elastic)
        collector.base_restart = self._base_restart
        collector.slots = list(self._slots)
        collector.look_at_cluster()  # relays first: a starting worker looks for its node's
        for slot in collector.slots:
            collector.spawn(slot)
        self.collector = collector

    def actors_ready(self, run) -> None:
        collector = self.collector
        # Fixed: every worker (the learner needs each one's rollouts). Elastic: one, the
        # others join when they are ready.
        collector.wait_started(len(collector.slots) if not self.elastic(run.cfg) else 1)
        self.sink = PlacingSink(
            run.pipeline,
            lambda traj: run.placement.place(jax.device_put(traj, run.devices.learners[0])),
        )

    def worker_pids(self) -> list[int]:
        """Pid of each worker's current process (on its node)."""
        return [slot.pid for slot in self.slots]

    # Running -------------------------------------------------------------------------
    def loops(self, run) -> list[tuple[str, Callable[[], None]]]:
        loops = [("ray-collector", self.collector.run_loop)]
        if isinstance(self.order, FixedOrder):
            order, first = self.order, run.learner.version  # every worker's next rollout
            loops += [
                (f"ray-worker-{slot.worker_id}", lambda i=slot.worker_id: order.pump(i, first))
                for slot in self.slots
            ]
        return loops

    def starting(self, run) -> None:
        self._store_in_use = self._store_bytes()

    def line_extras(self, run) -> dict[str, float]:
        stored = self._store_bytes()
        if not run.lifetime.stopping:  # the workers are alive: what the report gives
            self._store_in_use = stored
        extras = {
            "ray/object_store_bytes": stored,
            "ray/data_wait_max_s": run.pipeline.take_longest_wait(),
        }
        collector = self.collector
        if collector is not None:
            versions = max(run.learner.version - self._first_version, 1)
            extras["ray/workers_alive"] = collector.alive()
            extras["ray/workers_pending"] = collector.pending()
            extras["ray/weight_bytes_out_per_version"] = (
                collector.fetches_out() * self._params_bytes / versions
            )
            if collector.relays is not None:
                extras["ray/relays"] = len(collector.relays.handles)
        return extras

    def stopping(self, run) -> None:
        self._kill_workers()

    def report(self, run) -> RayReport:
        m = run.metrics
        collector = self.collector
        return RayReport(
            restarts=int(m.total("ray/restarts")),
            lost_rollouts=int(m.total("ray/lost_rollouts")),
            stamps=tuple(run.pipeline.consumed.stamps()),
            worker_nodes=tuple(slot.node for slot in self.slots),
            object_store_bytes=self._store_in_use,
            data_order=run.cfg.ray.data_order,
            dropped_rollouts=int(m.total("ray/dropped_rollouts")),
            lost_credits=int(m.total("ray/lost_credits")),
            weight_bytes_out=(collector.fetches_out() if collector else 0) * self._params_bytes,
        )

    def _store_bytes(self) -> int:
        try:
            return ray_cluster.object_store_bytes(self._ray)
        except Exception:  # noqa: BLE001 - a metric must not fail the run
            return -1

    def _kill_workers(self) -> None:
        if self.collector is not None:
            self.collector.kill()

    def close(self) -> None:
        """Kill every worker and relay and leave (or stop) Ray; idempotent."""
        if self._ray is not None:
            self._kill_workers()
        if self._run is not None:
            with contextlib.suppress(Exception):
                self._run.publisher.close()
        self._stack.close()


__all__ = [
    "NoWorkers",
    "RayReport",
    "RayTopology",
    "WorkerCrashLoop",
    "WorkerNotReady",
]
