"""The Ray topology: actors as Ray workers on any node, the learner and evaluator here.

`prepare` starts (or joins) Ray, builds the learner with the same factories as the thread
runtime, publishes version 0 through the `ray` weight-sync transport and starts one
`RolloutWorker` per worker id (each compiles its policy before training starts).
`RayRun.run` then runs, in threads of this process, one pump per worker, the learner, the
evaluator and the logger. A pump pulls its worker's rollouts (host arrays) one at a time,
places each on the learner mesh exactly as the thread runtime's sink does, and queues it
in the same per-actor pipeline, asking for the next one before placing the current one;
so at most `queue_size` rollouts wait in a worker plus one on its way, and the object
store holds no backlog.

Data order and restarts: update k consumes rollout seq k of every worker, in worker order,
as in the thread runtime. When a worker dies (process killed, node lost, its loop raised),
its pump counts the rollouts it had finished but not delivered as lost and starts a new
worker for the same id with fresh seeds (run seed, worker id, restart count) and
`first_seq` = the next seq the learner expects, so the slot is filled by the new
incarnation and no seq is consumed twice. Every consumed rollout is stamped (worker,
restart, seq); `RayTrainResult.stamps` lists them in consumption order. A worker that
fails more than `ray.max_restarts` times stops the run with its last error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

from podrace.algos.normalizer import acting_apply
from podrace.config import TrainConfig, resolved
from podrace.control import (
    ComponentError,
    Control,
    ExplainedError,
    Lifetime,
    Stopped,
    Watchdog,
    raise_stopped_if_stopping,
)
from podrace.envs import env_spec, resolve_backend
from podrace.evaluate import EvalResult, make_greedy_policy
from podrace.metrics.loggers import check_sinks
from podrace.metrics.registry import Metrics
from podrace.networks import make_network
from podrace.pipeline import Pipeline, PlacingSink
from podrace.runtime import ray_cluster
from podrace.runtime.build import build_evaluator, build_learner, dummy_trajectory, warm_up_learner
from podrace.runtime.devices import resolve_devices
from podrace.runtime.ray_worker import RolloutWorker, Shipment, WorkerSpec
from podrace.runtime.run_log import RunLog
from podrace.runtime.rundir import create_run_dir, remove_run_dir
from podrace.runtime.single_host import TrainResult
from podrace.runtime.threads import ThreadGroup, close_envs
from podrace.types import Rollout
from podrace.validation import validate, worker_resources

STOP_GRACE_S = 10.0
"""Seconds the threads get to return after a stop (killing workers wakes their pumps)."""


class WorkerCrashLoop(ExplainedError, RuntimeError):
    """A worker failed more often than `ray.max_restarts` allows."""


class WorkerNotReady(ExplainedError, TimeoutError):
    """A restarted worker did not start within `ray.start_timeout_s`."""


@dataclass(frozen=True)
class RayTrainResult(TrainResult):
    restarts: int = 0
    lost_rollouts: int = 0
    stamps: tuple[tuple[int, int, int], ...] = ()
    """(worker, restart, seq) of every consumed rollout, in the order the learner took them."""
    worker_nodes: tuple[str, ...] = ()
    """Ray node id each worker ran on last."""
    object_store_bytes: int = 0
    """Object-store bytes in use when training ended (workers still alive)."""


class StampedPipeline(Pipeline):
    """The thread runtime's pipeline, also recording the stamp of every consumed rollout."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.stamps: list[tuple[int, int, int]] = []

    def next_batch(self, learner_version: int) -> tuple[list[Rollout], dict[str, float]]:
        batch, stats = super().next_batch(learner_version)
        self.stamps.extend((r.actor_id, r.restart, r.seq) for r in batch)
        return batch, stats


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


def train(cfg: TrainConfig, lifetime: Lifetime | None = None) -> RayTrainResult:
    """Train with actors as Ray workers; raises ConfigError before anything starts."""
    return prepare(cfg, lifetime).run()


def prepare(
    cfg: TrainConfig, lifetime: Lifetime | None = None, env_factory: Callable | None = None
) -> RayRun:
    """Validate, start or join Ray, build and compile everything, start the workers.

    `env_factory(env_cfg, num_envs, seed)` replaces `make_env` in the workers (tests inject
    faulty envs through it; it must be importable on every node). The returned run owns
    the Ray connection: `run()` releases it, as does a failure here.
    """
    lifetime = lifetime or Lifetime()
    cfg = resolved(dataclasses.replace(cfg, runtime="ray"))
    validate(cfg)
    logging.getLogger(__name__).warning("checkpoints are not written with --runtime ray yet")
    resolve_backend(cfg.env)
    devices = resolve_devices(cfg)
    spec = env_spec(cfg.env)
    check_sinks(cfg.log)
    ray_cluster.import_ray()
    ray_cluster.check_auth_not_disabled()
    lifetime.check()
    stack = contextlib.ExitStack()
    run_dir = None
    try:
        cluster = stack.enter_context(ray_cluster.connect(cfg.ray, num_cpus=cfg.ray.num_workers))
        run_dir = lifetime.run_dir = create_run_dir(cfg)
        (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
        return RayRun(cfg, spec, devices, run_dir, lifetime, cluster, stack, env_factory)
    except BaseException as error:
        stack.close()
        if run_dir is not None:  # nothing trained: leave no half-written run behind
            remove_run_dir(run_dir)
        raise_stopped_if_stopping(lifetime, error)
        raise


class RayRun:
    """A prepared Ray run: workers started and compiled; `run()` trains and cleans up."""

    def __init__(
        self, cfg, spec, devices, run_dir: Path, lifetime: Lifetime, cluster, stack, env_factory
    ):
        import ray

        self._ray, self._stack = ray, stack
        self.cfg, self.run_dir, self.lifetime, self.cluster = cfg, run_dir, lifetime, cluster
        self.metrics = metrics = Metrics()
        self.stuck: list[str] = []
        self.watchdog = Watchdog(lifetime, cfg.safety.watchdog_s)
        self._lock = threading.Lock()
        self._closing = False
        self._env_factory = env_factory
        self._spec = spec
        self._remote = ray.remote(RolloutWorker)
        self._resources = worker_resources(cfg.ray)
        from podrace.sync.ray_transport import RayPublisher

        network = make_network(cfg.network, spec)
        self.pipeline = StampedPipeline(
            cfg.num_actors, cfg.layout.queue_size, cfg.max_policy_lag, lifetime
        )
        self.publisher = publisher = RayPublisher()
        lifetime.on_stop(publisher.close)
        self.learner, placement = build_learner(
            cfg, spec, network, devices.learners, self.pipeline, publisher, metrics, lifetime
        )
        self.learner.on_update = self._after_update
        lifetime.on_stop(self._kill_workers)  # wakes every wait on a worker, also while starting
        first = devices.learners[0]
        # Host arrays go to one learner device, then through the thread runtime's placement.
        self.sink = PlacingSink(
            self.pipeline, lambda traj: placement.place(jax.device_put(traj, first))
        )
        greedy = make_greedy_policy(acting_apply(network.apply, cfg.normalize))

        compile_start = time.perf_counter()
        self.slots = [_Slot(i) for i in range(cfg.num_actors)]
        starts = [self._spawn(slot) for slot in self.slots]  # workers compile meanwhile
        # Placed from the host, as the workers' rollouts arrive (same shardings: no second compile).
        placed = placement.place(jax.device_get(dummy_trajectory(cfg, spec, first)))
        warm_up_learner(self.learner, [placed] * cfg.num_actors)
        for slot, start in zip(self.slots, starts):
            self._await_start(slot, start)
        # The evaluator's env exists only once every worker started (nothing to close before).
        params = publisher.subscribe(device=devices.evaluator, name="evaluator")
        control = Control(lifetime, self.watchdog.heartbeat("evaluator"), metrics.add_many)
        self.evaluator = build_evaluator(cfg, greedy, devices.evaluator, params, metrics, control)
        self.evaluator.warm_up(
            jax.device_get(self.learner.acting_params())
        )  # as the ray transport delivers
        self.compile_s = time.perf_counter() - compile_start
        for name in ("ray/restarts", "ray/lost_rollouts"):
            metrics.count(name, 0)

    # Workers -------------------------------------------------------------------------
    def _spawn(self, slot: _Slot) -> Any:
        """Create the Ray actor for `slot`'s current incarnation; returns its start() ref."""
        spec = WorkerSpec(
            self.cfg,
            self._spec,
            slot.worker_id,
            slot.restarts,
            slot.next_seq,
            self.publisher.board,
            self.publisher.channel,
        )
        with self._lock:
            if self._closing:
                raise Stopped("shutdown")
            slot.handle = self._remote.options(
                num_cpus=1,
                resources=self._resources,
                max_restarts=0,
                max_concurrency=2,  # next() waits while start() and the loop run
                runtime_env={"env_vars": {"JAX_PLATFORMS": "cpu"}},
            ).remote(spec, self._env_factory)
            slot.produced_until = slot.next_seq
            return slot.handle.start.remote()

    def _await_start(self, slot: _Slot, start: Any) -> None:
        """Until the worker started; one that dies starting is restarted as one that dies
        later would be (within `ray.max_restarts`)."""
        while True:
            try:
                slot.node, slot.pid = self._ray.get(start, timeout=self.cfg.ray.start_timeout_s)
                return
            except self._ray.exceptions.GetTimeoutError:
                raise ComponentError(
                    f"ray-worker-{slot.worker_id}",
                    TimeoutError(
                        f"not started within {self.cfg.ray.start_timeout_s:g}s "
                        "(no node with a free CPU"
                        f"{' and ' + str(self._resources) if self._resources else ''}?)"
                    ),
                ) from None
            except self._ray.exceptions.RayError as error:
                self.lifetime.check()
                try:
                    self._failed(slot, error)
                except WorkerCrashLoop as crash:
                    raise ComponentError(f"ray-worker-{slot.worker_id}", crash) from None
                start = self._spawn(slot)

    def _failed(self, slot: _Slot, error: BaseException) -> None:
        """Count what the dead incarnation took with it; raise once restarts run out."""
        if self.lifetime.stopping:
            raise Stopped("shutdown")
        lost = max(0, slot.produced_until - slot.next_seq)
        self.metrics.count("ray/lost_rollouts", lost)
        with self._lock:
            handle, slot.handle = slot.handle, None
        with contextlib.suppress(Exception):  # already dead, or dying
            self._ray.kill(handle, no_restart=True)
        cause = _cause(error)
        if slot.restarts >= self.cfg.ray.max_restarts:
            raise WorkerCrashLoop(
                f"ray worker {slot.worker_id} failed {slot.restarts + 1} time(s), restart limit "
                f"{self.cfg.ray.max_restarts} (--ray.max-restarts); last error: {_one_line(cause)}"
            ) from cause
        slot.restarts += 1
        self.metrics.count("ray/restarts")
        self.metrics.count(f"ray/worker-{slot.worker_id}/restarts")

    def _pump(self, slot: _Slot) -> None:
        """Deliver rollouts seq next_seq.. of one worker to the pipeline, restarting it."""
        ray, last = self._ray, self.cfg.num_updates
        ahead = None  # the request for the next rollout, sent before this one is placed
        while slot.next_seq < last:
            if slot.handle is None:
                ahead = None
                try:
                    slot.node, slot.pid = ray.get(
                        self._spawn(slot), timeout=self.cfg.ray.start_timeout_s
                    )
                except ray.exceptions.GetTimeoutError as error:
                    raise WorkerNotReady(
                        f"restarted worker not ready within {self.cfg.ray.start_timeout_s:g}s"
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
                self.metrics.add_many(record)
            self.metrics.count(f"ray/worker-{slot.worker_id}/rollouts")
            self.metrics.count(f"ray/node/{slot.node}/rollouts")
            self.sink.put(rollout)  # placed on the learner mesh, then queued (may wait)
            self.metrics.add("actor/to_learner", rollout.timings["to_learner"])
            slot.next_seq += 1

    def worker_pids(self) -> list[int]:
        """Pid of each worker's current process (on its node)."""
        return [slot.pid for slot in self.slots]

    def _after_update(self, version: int) -> None:
        every = self.cfg.eval.every_updates
        if every and version % every == 0 and version < self.cfg.num_updates:
            self.evaluator.request(version)

    # Running -------------------------------------------------------------------------
    def run(self) -> RayTrainResult:
        try:
            return self._run()
        finally:
            self.close()

    def _run(self) -> RayTrainResult:
        cfg, lifetime, metrics = self.cfg, self.lifetime, self.metrics
        final: list[EvalResult] = []
        learned: list[float] = []
        store: list[int] = []

        def learn() -> None:
            self.learner.run()
            learned.append(time.perf_counter() - train_start)
            store.append(self._store_bytes())
            final.append(self.evaluator.evaluate_final(self.learner.version))
            lifetime.stop("finished")

        log = RunLog(cfg, self.run_dir, metrics, lifetime, self._line_extras)
        group = ThreadGroup(lifetime)
        train_start = time.perf_counter()
        try:
            lifetime.check()
            for slot in self.slots:
                group.spawn(f"ray-worker-{slot.worker_id}", lambda slot=slot: self._pump(slot))
            group.spawn("evaluator", self.evaluator.run)
            group.spawn("learner", learn)
            group.spawn("watchdog", self.watchdog.run, guard_transfers=False)
            log.until_stopped(train_start)
        finally:  # also on KeyboardInterrupt: stop, kill workers, join, flush
            lifetime.stop("shutdown")
            self._kill_workers()
            self.stuck = group.join(STOP_GRACE_S)
            train_s = time.perf_counter() - train_start
            log.write(train_start, final=True)
            log.close()
            if "evaluator" not in self.stuck:
                self.stuck += close_envs([("evaluator", self.evaluator.env)])
        if lifetime.failure is not None:
            raise lifetime.failure
        return RayTrainResult(
            run_dir=self.run_dir,
            updates=self.learner.version,
            env_steps=int(metrics.total("env_steps")),
            compile_s=self.compile_s,
            train_s=train_s,
            learn_s=learned[0] if learned else train_s,
            final_eval=final[0] if final else None,
            max_policy_lag=float(metrics.last("lag/max_seen", 0.0)),
            restarts=int(metrics.total("ray/restarts")),
            lost_rollouts=int(metrics.total("ray/lost_rollouts")),
            stamps=tuple(self.pipeline.stamps),
            worker_nodes=tuple(slot.node for slot in self.slots),
            object_store_bytes=store[0] if store else self._store_bytes(),
        )

    def _store_bytes(self) -> int:
        try:
            return ray_cluster.object_store_bytes(self._ray)
        except Exception:  # noqa: BLE001 - a metric must not fail the run
            return -1

    def _line_extras(self) -> dict[str, float]:
        extras = {f"sync/{k}": v for k, v in self.publisher.metrics().items()}
        extras["ray/object_store_bytes"] = self._store_bytes()
        return extras

    def _kill_workers(self) -> None:
        with self._lock:
            self._closing = True
            handles = [slot.handle for slot in self.slots if slot.handle is not None]
        for handle in handles:
            with contextlib.suppress(Exception):
                self._ray.kill(handle, no_restart=True)

    def close(self) -> None:
        """Kill every worker and leave (or stop) Ray; idempotent."""
        self.lifetime.stop("shutdown")
        self._kill_workers()
        with contextlib.suppress(Exception):
            self.publisher.close()
        self._stack.close()


def _cause(error: BaseException) -> BaseException:
    """The worker's own exception inside a Ray error, when Ray kept it."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".strip()


__all__ = ["RayRun", "RayTrainResult", "WorkerCrashLoop", "prepare", "train"]
