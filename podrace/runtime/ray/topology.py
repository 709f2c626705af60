"""The Ray topology: actors as Ray workers on any node, the learner and evaluator here.

`join` starts (or joins) Ray. The learner publishes through the `ray` weight-sync
transport; `launch_actors` starts one `RolloutWorker` per worker id (each compiles its
policy while the learner compiles) and `actors_ready` waits for them. The loops are one
pump per worker, in threads of this process: a pump pulls its worker's rollouts (host
arrays) one at a time, places each on the learner mesh exactly as the thread topology's
sink does, and queues it in the same per-actor pipeline, asking for the next one before
placing the current one; so at most `queue_size` rollouts wait in a worker plus one on
its way, and the object store holds no backlog.

Data order and restarts: update k consumes rollout seq k of every worker, in worker order,
as in the thread topology. When a worker dies (process killed, node lost, its loop
raised), its pump counts the rollouts it had finished but not delivered as lost and
starts a new worker for the same id with fresh seeds (run seed, worker id, restart count)
and `first_seq` = the next seq the learner expects, so the slot is filled by the new
incarnation and no seq is consumed twice. Every consumed rollout is stamped (worker,
restart, seq) (`RayReport.stamps`). A worker that fails more than `ray.max_restarts`
times stops the run with its last error.

Checkpoints keep every worker's next seq and restart count. A resumed run starts every
worker as a new incarnation (restart count + 1: fresh seeds, new stamps) at the
checkpoint's next seqs, so data order and "nothing consumed twice" hold across the resume.
The worker count is part of what a checkpoint holds (the batch is one rollout per worker):
a resume cannot change `--ray.num-workers`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from podrace.checkpoints.state import RunState
from podrace.config import ConfigError, TrainConfig
from podrace.control import ComponentError, ExplainedError, Stopped
from podrace.pipeline import PlacingSink
from podrace.runtime.build import dummy_trajectory
from podrace.runtime.ray import cluster as ray_cluster
from podrace.runtime.ray.worker import RolloutWorker, Shipment, WorkerSpec, worker_seeds
from podrace.runtime.topology import Topology
from podrace.validation import worker_resources


class WorkerCrashLoop(ExplainedError, RuntimeError):
    """A worker failed more often than `ray.max_restarts` allows."""


class WorkerNotReady(ExplainedError, TimeoutError):
    """A restarted worker did not start within `ray.start_timeout_s`."""


@dataclass(frozen=True)
class RayReport:
    """What a Ray run adds to its TrainResult."""

    restarts: int = 0
    lost_rollouts: int = 0
    stamps: tuple[tuple[int, int, int], ...] = ()
    """(worker, restart, seq) of every consumed rollout, in the order the learner took them."""
    worker_nodes: tuple[str, ...] = ()
    """Ray node id each worker ran on last."""
    object_store_bytes: int = 0
    """Object-store bytes in use at the last metrics line before the run stopped, or at its
    start (the workers alive either way)."""


@dataclass
class _Slot:
    """One worker id: its current Ray actor and what the learner side knows about it."""

    worker_id: int
    handle: Any = None
    restarts: int = 0
    next_seq: int = 0
    """The next seq the learner expects from this worker."""
    produced_until: int = 0
    """One past the last seq the current incarnation reported finished."""
    node: str = ""
    pid: int = 0
    start: Any = None
    """The pending start() of the incarnation being launched."""


class RayTopology(Topology):
    name = "ray"
    stop_grace_s = 10.0  # killing workers wakes their pumps
    exit_grace_s = 30.0  # killing workers and stopping a local Ray take seconds

    def __init__(self) -> None:
        self.slots: list[_Slot] = []
        self.start_keys: np.ndarray | None = None
        self._stack = contextlib.ExitStack()
        self._lock = threading.Lock()
        self._closing = False
        self._ray: Any = None
        self._run: Any = None
        self._remote: Any = None
        self.cluster: ray_cluster.Cluster | None = None
        self._store_in_use = -1
        self._first_restarts: list[int] = []

    # Preparing ---------------------------------------------------------------------------
    def check(self, cfg: TrainConfig) -> None:
        # Ray's C++ crash handler also catches SIGTERM and re-raises it after podrace's,
        # which made one SIGTERM look like two; crash stack traces stay in Ray's logs.
        os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
        ray_cluster.import_ray()  # a missing Ray is a one-line error before JAX starts
        ray_cluster.check_auth_not_disabled()

    def join(self, cfg: TrainConfig, lifetime, resuming: bool) -> TrainConfig:
        import ray

        self._ray = ray
        lifetime.check()
        self.cluster = self._stack.enter_context(
            ray_cluster.connect(cfg.ray, num_cpus=cfg.ray.num_workers)
        )
        self._remote = ray.remote(RolloutWorker)
        lifetime.on_stop(self._kill_workers)  # wakes every wait on a worker, starting too
        return cfg

    def publisher(self, run, first_version: int):
        from podrace.sync.ray_transport import RayPublisher

        return RayPublisher(first_version=first_version)

    def published(self, params: Any) -> Any:
        return jax.device_get(params)  # as the ray transport delivers

    def learner_dummies(self, run) -> list:
        # Placed from the host, as the workers' rollouts arrive (same shardings).
        first = run.devices.learners[0]
        placed = run.placement.place(jax.device_get(dummy_trajectory(run.cfg, run.spec, first)))
        return [placed] * run.cfg.num_actors

    def saved_actors(self, run) -> int:
        return run.cfg.num_actors

    def actors_start(self, run, restored: RunState | None) -> dict:
        n = run.cfg.num_actors
        if restored is None:
            self.slots = [_Slot(i) for i in range(n)]
            keys = [worker_seeds(run.cfg.seed, i, 0)[0] for i in range(n)]
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
            self.slots = [
                _Slot(i, restarts=restarts[i] + 1, next_seq=version, produced_until=version)
                for i in range(n)
            ]
            keys = list(restored.actor_keys)
        self.start_keys = np.stack([np.asarray(jax.device_get(k)) for k in keys])
        self._first_restarts = [slot.restarts for slot in self.slots]
        for slot in self.slots:
            run.metrics.count(f"ray/worker-{slot.worker_id}/restarts", 0)
        for name in ("ray/restarts", "ray/lost_rollouts"):
            run.metrics.count(name, 0)
        return self.actors_saved(run, run.learner.version)

    def actors_saved(self, run, version: int) -> dict:
        return {
            "actor_keys": self.start_keys,
            "actor_next_seq": (version,) * len(self.slots),
            "actor_restarts": tuple(slot.restarts for slot in self.slots),
        }

    def launch_actors(self, run) -> None:
        self._run = run
        for slot in self.slots:
            slot.start = self._spawn(slot)

    def actors_ready(self, run) -> None:
        for slot in self.slots:
            self._await_start(slot)
        self.sink = PlacingSink(
            run.pipeline,
            lambda traj: run.placement.place(jax.device_put(traj, run.devices.learners[0])),
        )

    # Workers -------------------------------------------------------------------------
    def _spawn(self, slot: _Slot) -> Any:
        """Create the Ray actor for `slot`'s current incarnation; returns its start() ref."""
        run = self._run
        spec = WorkerSpec(
            run.cfg,
            run.spec,
            slot.worker_id,
            slot.restarts,
            slot.next_seq,
            run.publisher.board,
            run.publisher.channel,
            run.envs,
        )
        with self._lock:
            if self._closing:
                raise Stopped("shutdown")
            slot.handle = self._remote.options(
                num_cpus=1,
                resources=worker_resources(run.cfg.ray),
                max_restarts=0,
                max_concurrency=2,  # next() waits while start() and the loop run
                runtime_env={"env_vars": {"JAX_PLATFORMS": "cpu"}},
            ).remote(spec)
            slot.produced_until = slot.next_seq
            return slot.handle.start.remote()

    def _await_start(self, slot: _Slot) -> None:
        """Until the worker started; one that dies starting is restarted as one that dies
        later would be (within `ray.max_restarts`)."""
        ray, cfg = self._ray, self._run.cfg
        while True:
            try:
                slot.node, slot.pid = ray.get(slot.start, timeout=cfg.ray.start_timeout_s)
                return
            except ray.exceptions.GetTimeoutError:
                resources = worker_resources(cfg.ray)
                raise ComponentError(
                    f"ray-worker-{slot.worker_id}",
                    TimeoutError(
                        f"not started within {cfg.ray.start_timeout_s:g}s (no node with a free "
                        f"CPU{' and ' + str(resources) if resources else ''}?)"
                    ),
                ) from None
            except ray.exceptions.RayError as error:
                self._run.lifetime.check()
                try:
                    self._failed(slot, error)
                except WorkerCrashLoop as crash:
                    raise ComponentError(f"ray-worker-{slot.worker_id}", crash) from None
                slot.start = self._spawn(slot)

    def _failed(self, slot: _Slot, error: BaseException) -> None:
        """Count what the dead incarnation took with it; raise once restarts run out."""
        run = self._run
        if run.lifetime.stopping:
            raise Stopped("shutdown")
        lost = max(0, slot.produced_until - slot.next_seq)
        run.metrics.count("ray/lost_rollouts", lost)
        with self._lock:
            handle, slot.handle = slot.handle, None
        with contextlib.suppress(Exception):  # already dead, or dying
            self._ray.kill(handle, no_restart=True)
        cause = _cause(error)
        incarnations = slot.restarts - self._first_restart(slot)
        if incarnations >= run.cfg.ray.max_restarts:
            raise WorkerCrashLoop(
                f"ray worker {slot.worker_id} failed {incarnations + 1} time(s), restart limit "
                f"{run.cfg.ray.max_restarts} (--ray.max-restarts); last error: {_one_line(cause)}"
            ) from cause
        slot.restarts += 1
        run.metrics.count("ray/restarts")
        run.metrics.count(f"ray/worker-{slot.worker_id}/restarts")

    def _first_restart(self, slot: _Slot) -> int:
        """The restart count this run started the worker with (the restart budget is
        per run: a resumed run's workers start beyond the restarts before it)."""
        return int(self._first_restarts[slot.worker_id])

    def _pump(self, slot: _Slot) -> None:
        """Deliver rollouts seq next_seq.. of one worker to the pipeline, restarting it."""
        ray, run = self._ray, self._run
        cfg, last = run.cfg, run.cfg.num_updates
        ahead = None  # the request for the next rollout, sent before this one is placed
        while slot.next_seq < last:
            if slot.handle is None:
                ahead = None
                try:
                    slot.node, slot.pid = ray.get(
                        self._spawn(slot), timeout=cfg.ray.start_timeout_s
                    )
                except ray.exceptions.GetTimeoutError as error:
                    raise WorkerNotReady(
                        f"restarted worker not ready within {cfg.ray.start_timeout_s:g}s"
                    ) from error
                except ray.exceptions.RayError as error:
                    self._failed(slot, error)
                    continue
            request, ahead = ahead or slot.handle.next.remote(), None
            try:
                shipment: Shipment = ray.get(request)
            except ray.exceptions.RayError as error:
                self._failed(slot, error)
                continue
            del request
            rollout = shipment.rollout
            if rollout.seq != slot.next_seq:
                raise RuntimeError(
                    f"worker {slot.worker_id} sent seq {rollout.seq}, expected {slot.next_seq}"
                )
            if slot.next_seq + 1 < last:
                ahead = slot.handle.next.remote()  # its reply travels while this one is placed
            slot.produced_until = shipment.produced_until
            for record in shipment.records:
                run.metrics.add_many(record)
            run.metrics.count(f"ray/worker-{slot.worker_id}/rollouts")
            run.metrics.count(f"ray/node/{slot.node}/rollouts")
            self.sink.put(rollout)  # placed on the learner mesh, then queued (may wait)
            run.metrics.add("actor/to_learner", rollout.timings["to_learner"])
            slot.next_seq += 1

    def worker_pids(self) -> list[int]:
        """Pid of each worker's current process (on its node)."""
        return [slot.pid for slot in self.slots]

    # Running -------------------------------------------------------------------------
    def loops(self, run) -> list[tuple[str, Callable[[], None]]]:
        return [
            (f"ray-worker-{slot.worker_id}", lambda slot=slot: self._pump(slot))
            for slot in self.slots
        ]

    def starting(self, run) -> None:
        self._store_in_use = self._store_bytes()

    def line_extras(self, run) -> dict[str, float]:
        stored = self._store_bytes()
        if not run.lifetime.stopping:  # the workers are alive: what the report gives
            self._store_in_use = stored
        return {"ray/object_store_bytes": stored}

    def stopping(self, run) -> None:
        self._kill_workers()

    def report(self, run) -> RayReport:
        m = run.metrics
        return RayReport(
            restarts=int(m.total("ray/restarts")),
            lost_rollouts=int(m.total("ray/lost_rollouts")),
            stamps=tuple(run.pipeline.consumed.stamps()),
            worker_nodes=tuple(slot.node for slot in self.slots),
            object_store_bytes=self._store_in_use,
        )

    def _store_bytes(self) -> int:
        try:
            return ray_cluster.object_store_bytes(self._ray)
        except Exception:  # noqa: BLE001 - a metric must not fail the run
            return -1

    def _kill_workers(self) -> None:
        with self._lock:
            self._closing = True
            handles = [slot.handle for slot in self.slots if slot.handle is not None]
        for handle in handles:
            with contextlib.suppress(Exception):
                self._ray.kill(handle, no_restart=True)

    def close(self) -> None:
        """Kill every worker and leave (or stop) Ray; idempotent."""
        if self._ray is not None:
            self._kill_workers()
        if self._run is not None:
            with contextlib.suppress(Exception):
                self._run.publisher.close()
        self._stack.close()


def _cause(error: BaseException) -> BaseException:
    """The worker's own exception inside a Ray error, when Ray kept it."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".strip()


__all__ = ["RayReport", "RayTopology", "WorkerCrashLoop", "WorkerNotReady"]
