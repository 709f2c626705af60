"""The Ray-worker fleet: actors as Ray workers on any node of the cluster the `RayDriver`
joined; the learner and evaluator here.

The learner publishes through the `ray` weight-sync transport, which reaches each node's
workers through a relay on that node (`podrace.runtime.ray.relays`; `--ray.no-node-relay`:
every worker reads the learner's board). `start` launches one `RolloutWorker` per worker
id (each compiles its policy while the learner compiles) and `ready` waits for them. One
thread of this process, the collector (`podrace.runtime.ray.collector`), makes every Ray
call on the workers: it
receives each rollout as soon as its worker finishes it, and restarts a worker that dies
(process killed, node lost, its loop raised) with fresh seeds (run seed, worker id, restart
count). Every consumed rollout is stamped (worker, restart, seq) (`RayReport.stamps`); a
worker that fails more than `ray.max_restarts` times stops the run with its last error.

Two data orders (`--ray.data-order`):

- fixed: update k consumes rollout seq k of every worker, in worker order, as actor
  threads do. One pump thread per worker places its rollouts on the learner mesh, in seq
  order, and queues them in the same per-actor pipeline. A replacement worker starts at the
  seq after the last one received, so the slot is filled by the new incarnation and no seq
  is consumed twice; the learner waits for it.
- elastic: each update consumes the first `ray.rollouts_per_update` rollouts to arrive from
  any workers, within the lag bound (`podrace.runtime.ray.elastic.ElasticPipeline`, which
  also grants the credits that bound what each worker makes). A lost worker costs its in-flight
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

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from podrace.checkpoints.state import RunState
from podrace.config import TrainConfig
from podrace.control import Lifetime
from podrace.pipeline import Pipeline, PlacingSink
from podrace.runtime.build import dummy_trajectory
from podrace.runtime.fleet import FleetContext, continued_version
from podrace.runtime.ray.cluster import worker_capacity
from podrace.runtime.ray.collector import Collector
from podrace.runtime.ray.driver import RayDriver
from podrace.runtime.ray.elastic import ElasticPipeline
from podrace.runtime.ray.orders import ElasticOrder, FixedOrder
from podrace.runtime.ray.relays import Relays
from podrace.runtime.ray.restarts import NoWorkers, Slot, WorkerCrashLoop, WorkerNotReady
from podrace.runtime.ray.worker import RolloutWorker, WorkerSpec, worker_seeds
from podrace.runtime.threads.actors import per_actor_pipeline
from podrace.sync.ray_transport import RayPublisher


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


class RayWorkers:
    """Ray workers run the actor loop; this process collects their rollouts."""

    def __init__(self, driver: RayDriver) -> None:
        self.driver = driver
        self.ctx: FleetContext | None = None
        self.start_keys: np.ndarray | None = None
        self.collector: Collector | None = None
        self.order: FixedOrder | ElasticOrder | None = None
        self.sink: PlacingSink | None = None
        self._publisher: RayPublisher | None = None
        self._started = False
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

    # Before the learner exists -------------------------------------------------------
    def publisher(self, first_version: int) -> RayPublisher:
        self._first_version = first_version
        self._publisher = RayPublisher(first_version=first_version)
        return self._publisher

    def published(self, params: Any) -> Any:
        return jax.device_get(params)  # as the ray transport delivers

    def pipeline(
        self, cfg: TrainConfig, lifetime: Lifetime, first_seq: int
    ) -> Pipeline | ElasticPipeline:
        if not self.elastic(cfg):
            return per_actor_pipeline(cfg, lifetime, first_seq)
        return ElasticPipeline(
            cfg.num_actors,
            cfg.max_policy_lag,
            lifetime,
            first_version=first_seq,
            grant=self._grant,
        )

    def _grant(self, grants) -> None:
        if self.collector is not None:
            self.collector.grant(grants)

    def saved_actor_count(self, cfg: TrainConfig, num_processes: int) -> int:
        return cfg.num_actors

    # Preparing ---------------------------------------------------------------------------
    def restore(self, ctx: FleetContext, restored: RunState | None) -> dict:
        self.ctx = ctx
        cfg = ctx.cfg
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
            version = continued_version(restored, n, "worker", "the fixed data order")
            restarts = restored.actor_restarts or (0,) * n
            # Every worker of a resumed run is a new incarnation: fresh seeds, new stamps.
            self._slots = [
                Slot(i, restarts=restarts[i] + 1, first_restart=restarts[i] + 1, next_seq=version)
                for i in range(n)
            ]
            keys = list(restored.actor_keys)
        self.start_keys = np.stack([np.asarray(jax.device_get(k)) for k in keys])
        for slot in self._slots:
            ctx.metrics.count(f"ray/worker-{slot.worker_id}/restarts", 0)
        for name in ("ray/restarts", "ray/lost_rollouts", "ray/joins"):
            ctx.metrics.count(name, 0)
        if self.elastic(cfg):
            for name in ("ray/dropped_rollouts", "ray/lost_credits"):
                ctx.metrics.count(name, 0)
        return self.save(ctx.version() if restored is None else restored.version)

    def _initial_workers(self, cfg: TrainConfig) -> int:
        """Workers launched at the start: the number asked for, or (auto) as many as the
        cluster holds now, at least one."""
        if cfg.ray.num_workers != "auto":
            return cfg.ray.num_workers
        fits = sum(worker_capacity(self.driver.ray, cfg.ray).values())
        if cfg.ray.max_workers is not None:
            fits = min(fits, cfg.ray.max_workers)
        return max(1, fits)

    def save(self, version: int) -> dict:
        slots = self.slots
        if self.elastic(self.ctx.cfg):
            n = self.ctx.cfg.num_actors
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

    def start(self) -> None:
        ctx, ray = self.ctx, self.driver.ray
        cfg = ctx.cfg
        self._started = True
        self._params_bytes = sum(np.asarray(x).nbytes for x in jax.tree.leaves(ctx.published))
        board, channel = ctx.publisher.board, ctx.publisher.channel
        relays = None
        if cfg.ray.node_relay:
            node = ray.get_runtime_context().get_node_id()
            relays = Relays(ray, board, channel, node)
        elastic = self.elastic(cfg)
        self.sink = PlacingSink(
            ctx.pipeline,
            lambda traj: ctx.placement.place(jax.device_put(traj, ctx.devices.learners[0])),
        )
        self.order = ElasticOrder(ctx) if elastic else FixedOrder(ctx, self.sink)

        def spec(slot: Slot) -> WorkerSpec:
            return WorkerSpec(
                cfg,
                ctx.spec,
                slot.worker_id,
                slot.restarts,
                slot.next_seq,
                board,
                channel,
                ctx.envs,
                elastic=elastic,
                relay=relays.prefix if relays is not None else None,
            )

        remote = ray.remote(RolloutWorker)
        collector = Collector(ray, ctx, remote, spec, self.order, relays, elastic)
        collector.base_restart = self._base_restart
        collector.slots = list(self._slots)
        self.collector = collector
        collector.look_at_cluster()  # relays first: a starting worker looks for its node's
        for slot in collector.slots:
            collector.spawn(slot)
        ctx.lifetime.on_stop(self._kill_workers)  # wakes every wait on a worker, starting too

    def learner_dummies(self) -> list:
        # Placed from the host, as the workers' rollouts arrive (same shardings).
        ctx = self.ctx
        first = ctx.devices.learners[0]
        placed = ctx.placement.place(jax.device_get(dummy_trajectory(ctx.cfg, ctx.spec, first)))
        return [placed] * ctx.cfg.num_actors

    def ready(self) -> None:
        collector = self.collector
        # Fixed: every worker (the learner needs each one's rollouts). Elastic: one, the
        # others join when they are ready.
        collector.wait_started(len(collector.slots) if not self.elastic(self.ctx.cfg) else 1)

    def worker_pids(self) -> list[int]:
        """Pid of each worker's current process (on its node)."""
        return [slot.pid for slot in self.slots]

    # Running -------------------------------------------------------------------------
    def loops(self) -> list[tuple[str, Callable[[], None]]]:
        self._store_in_use = self._store_bytes()  # the workers are alive: the report's
        loops = [("ray-collector", self.collector.run_loop)]
        if isinstance(self.order, FixedOrder):
            order, first = self.order, self.ctx.version()  # every worker's next rollout
            loops += [
                (f"ray-worker-{slot.worker_id}", lambda i=slot.worker_id: order.pump(i, first))
                for slot in self.slots
            ]
        return loops

    def line_extras(self) -> dict[str, float]:
        ctx = self.ctx
        stored = self._store_bytes()
        if not ctx.lifetime.stopping:  # the workers are alive: what the report gives
            self._store_in_use = stored
        extras = {
            "ray/object_store_bytes": stored,
            "ray/data_wait_max_s": ctx.pipeline.take_longest_wait(),
        }
        collector = self.collector
        if collector is not None:
            versions = max(ctx.version() - self._first_version, 1)
            extras["ray/workers_alive"] = collector.alive()
            extras["ray/workers_pending"] = collector.pending()
            extras["ray/weight_bytes_out_per_version"] = (
                collector.fetches_out() * self._params_bytes / versions
            )
            if collector.relays is not None:
                extras["ray/relays"] = len(collector.relays.handles)
        return extras

    def env_owners(self) -> list[tuple[str, Any]]:
        return []  # the workers own their envs

    def report(self) -> RayReport:
        ctx, collector = self.ctx, self.collector
        m = ctx.metrics
        return RayReport(
            restarts=int(m.total("ray/restarts")),
            lost_rollouts=int(m.total("ray/lost_rollouts")),
            stamps=tuple(ctx.pipeline.consumed.stamps()),
            worker_nodes=tuple(slot.node for slot in self.slots),
            object_store_bytes=self._store_in_use,
            data_order=ctx.cfg.ray.data_order,
            dropped_rollouts=int(m.total("ray/dropped_rollouts")),
            lost_credits=int(m.total("ray/lost_credits")),
            weight_bytes_out=(collector.fetches_out() if collector else 0) * self._params_bytes,
        )

    def _store_bytes(self) -> int:
        try:
            return object_store_bytes(self.driver.ray)
        except Exception:  # noqa: BLE001 - a metric must not fail the run
            return -1

    def _kill_workers(self) -> None:
        if self.collector is not None:
            self.collector.kill()

    def close(self) -> None:
        """Kill every worker and relay; close the publisher once workers read it."""
        self._kill_workers()
        if self._started:
            with contextlib.suppress(Exception):
                self._publisher.close()


def object_store_bytes(ray: Any) -> int:
    """Bytes in use in the object stores of all nodes, as the nodes last reported them."""
    total = ray.cluster_resources().get("object_store_memory", 0.0)
    free = ray.available_resources().get("object_store_memory", 0.0)
    return int(max(total - free, 0.0))


__all__ = [
    "NoWorkers",
    "RayReport",
    "RayWorkers",
    "WorkerCrashLoop",
    "WorkerNotReady",
]
