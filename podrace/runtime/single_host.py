"""The thread topology (one host): actors, learner and evaluator as threads of one process.

`prepare` validates, builds every component with the factories of `runtime.build` and
compiles the jitted functions (so compile time is reported apart from training time);
`SingleHostRun.run` starts the threads and logs until the run finishes, fails or is
stopped. Everything that can fail because of the config fails before any thread starts.

Shutdown: on a stop (end of training, a failure, a signal) every thread is given
`STOP_GRACE_S` to return. A thread still alive after that is stuck in foreign code (an env
call that ignores the stop): it is left behind as a daemon thread, its envs are not closed
(closing an env under a running call can crash the process), and its name is kept in
`SingleHostRun.stuck` so that a CLI can exit the process without waiting for it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np

from podrace.actor import make_policy_fns
from podrace.algos.normalizer import acting_apply
from podrace.checkpoint import RunState, checkpoint_dir
from podrace.config import ConfigError, TrainConfig, replace, resolved
from podrace.control import Control, Lifetime, Watchdog, raise_stopped_if_stopping
from podrace.envs import EnvSource
from podrace.envs.source import factory_record
from podrace.evaluate import EvalResult, make_greedy_policy
from podrace.metrics.loggers import Sink, check_sinks
from podrace.metrics.registry import Metrics
from podrace.networks import make_network
from podrace.pipeline import Pipeline, PlacingSink
from podrace.restore import restore
from podrace.runtime import threads
from podrace.runtime.build import (
    actor_key,
    build_actor,
    build_evaluator,
    build_learner,
    dummy_trajectory,
    warm_up_learner,
)
from podrace.runtime.checkpoints import RunCheckpoints
from podrace.runtime.devices import resolve_devices
from podrace.runtime.distributed import local_copy
from podrace.runtime.memory import check_fits
from podrace.runtime.resume import Resume, ResumePoint, commit, resume_point, resumed_envs
from podrace.runtime.run_lock import RunLock
from podrace.runtime.run_log import RunLog
from podrace.runtime.rundir import (
    create_run_dir,
    discard_if_untrained,
    remove_run_dir,
    write_config,
)
from podrace.runtime.supervisor import interrupts_stop
from podrace.runtime.threads import ThreadGroup, close_envs
from podrace.runtime.xla_setup import deterministic_gpu_ops
from podrace.sync.base import ChannelClosed
from podrace.sync.local import LocalPublisher
from podrace.validation import validate

FINAL_SAVE_WAIT_S = 1.0
"""How long a run that finished waits for its final save before writing its final metrics
line (so that line names that checkpoint): less than the CLI's exit grace, so a signal
that comes meanwhile still leaves time for the line."""
STOP_GRACE_S = 1.0
"""Seconds every thread gets to return after a stop before it is considered stuck."""


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path
    updates: int
    env_steps: int
    compile_s: float
    train_s: float
    learn_s: float
    """Seconds from starting the threads until the last update was published (train_s also
    counts the final evaluation and shutdown)."""
    final_eval: EvalResult | None
    max_policy_lag: float
    skipped_updates: int = 0
    """Updates skipped as non-finite (safety.on_nonfinite=skip)."""
    checkpoint: int | None = None
    """Version of the last checkpoint this run wrote completely (None: none)."""


def train(
    cfg: TrainConfig | None,
    lifetime: Lifetime | None = None,
    envs: EnvSource | None = None,
    resume: Resume | None = None,
) -> TrainResult:
    """Train with the single-host thread runtime; raises ConfigError before anything starts.
    Ctrl-C in a library caller's main thread stops the run cleanly (`interrupts_stop`)."""
    lifetime = lifetime or Lifetime()
    with interrupts_stop(lifetime):
        return prepare(cfg, lifetime, envs, resume).run()


def prepare(
    cfg: TrainConfig | None,
    lifetime: Lifetime | None = None,
    envs: EnvSource | None = None,
    resume: Resume | None = None,
) -> SingleHostRun:
    """Validate, build and compile everything; no thread is started yet.

    `lifetime` lets a caller stop the run from outside (a signal); a stop during
    preparation raises `Stopped` between steps. `envs` is where actors and the evaluator
    get their envs (a user's env factory); by default `cfg.env.id` through its backend.
    With `resume`, the run continues the one in `resume.run_dir` from a checkpoint; `cfg`
    is then None (the checkpoint's config) or that config with changes
    `podrace.runtime.resume.RESUMABLE` allows.
    """
    lifetime = lifetime or Lifetime()
    if resume is not None:
        # Held before the resume point is read: a run still writing there (or another resume)
        # would change it under us. A path that is no directory gets resume_point's message.
        lock = RunLock(resume.run_dir) if Path(resume.run_dir).is_dir() else None
        try:
            run = _prepare_resumed(cfg, lifetime, envs, resume)
        except BaseException as error:
            if lock is not None:
                lock.release()
            raise_stopped_if_stopping(lifetime, error)
            raise
        run.lock = lock
        return run
    envs, spec, devices = _checked(cfg, lifetime, envs)
    run_dir = lifetime.run_dir = create_run_dir(
        cfg
    )  # last: nothing is written unless every check passed
    lock = RunLock(run_dir)
    try:
        effective = replace(resolved(cfg), **{"log.run_name": run_dir.name})
        write_config(run_dir, effective)
        run = SingleHostRun(effective, spec, devices, run_dir, lifetime, envs)
    except BaseException as error:
        lock.release()
        remove_run_dir(run_dir)
        raise_stopped_if_stopping(lifetime, error)
        raise
    run.lock = lock
    return run


def _checked(cfg: TrainConfig, lifetime: Lifetime, envs: EnvSource | None):
    """(envs, spec, devices) once everything that needs no compile has been checked."""
    envs = envs or EnvSource(cfg.env)
    validate(cfg)
    spec = envs.spec()  # the backend (or the factory) is checked first
    check_sinks(cfg.log)
    if cfg.deterministic:  # the CLI has set it; a library caller may not have
        deterministic_gpu_ops()
    devices = resolve_devices(cfg)
    check_fits(cfg, make_network(cfg.network, spec), spec, devices)
    lifetime.check()
    return envs, spec, devices


def _prepare_resumed(
    cfg: TrainConfig | None, lifetime: Lifetime, envs: EnvSource | None, resume: Resume
):
    point = resume_point(resume, cfg)
    cfg = point.cfg
    envs, spec, devices = _checked(cfg, lifetime, resumed_envs(point, envs))
    run = SingleHostRun(cfg, spec, devices, point.run_dir, lifetime, envs, point)
    try:  # last: the run directory changes only once the resumed run is fully built
        written = commit(point, run.start.version, run.start.env_steps, cfg)
    except BaseException:
        run.close_envs()
        raise
    run.time_offset = max(run.time_offset, written)
    return run


class SingleHostRun:
    """Every component of one run, wired together; `run()` starts the threads."""

    def __init__(
        self,
        cfg: TrainConfig,
        spec,
        devices,
        run_dir: Path,
        lifetime: Lifetime,
        envs: EnvSource,
        resume: ResumePoint | None = None,
    ):
        self.cfg, self.run_dir, self.devices = cfg, run_dir, devices
        self.lifetime = lifetime
        self.metrics = metrics = Metrics()
        self.watchdog = Watchdog(lifetime, cfg.safety.watchdog_s)
        self.stuck: list[str] = []
        self.actors: list = []
        self.evaluator = None
        self.lock: RunLock | None = None
        """This process's hold on `run_dir` (see `podrace.runtime.run_lock`), released when
        `run()` returns."""
        self.evaluates = not cfg.distributed.process_id
        """Only process 0 of a multi-host run evaluates (and every single-host run)."""
        self.extra_sinks: list[Sink] = []
        """Metrics sinks a caller adds before `run()` (after the configured ones)."""
        self.time_offset = 0.0
        """Seconds of training before this run (a resumed run's clock continues)."""
        self._train_start = time.perf_counter()
        network = make_network(cfg.network, spec)
        first = resume.step if resume is not None else 0
        self.pipeline = pipeline = Pipeline(
            cfg.num_actors, cfg.layout.queue_size, cfg.max_policy_lag, lifetime, first_seq=first
        )
        # Actors get this process's copy of the (possibly multi-process) replicated params.
        self.publisher = publisher = LocalPublisher(transform=local_copy, first_version=first)
        lifetime.on_stop(publisher.close)
        restored: list[RunState] = []

        def from_checkpoint(state, keys, normalizer):
            n = cfg.num_actors
            like = RunState(state, keys, np.zeros((n, 2), np.uint32), (0,) * n, 0, 0, 0, normalizer)
            restored.append(restore(checkpoint_dir(run_dir), like, spec, first))
            return restored[0].train_state, restored[0].learner_keys, restored[0].normalizer

        try:
            self.learner, placement = build_learner(
                cfg,
                spec,
                network,
                devices.learners,
                pipeline,
                publisher,
                metrics,
                lifetime,
                restore=from_checkpoint if resume is not None else None,
            )
        except ChannelClosed:  # a stop closed the publisher before the first publish
            lifetime.check()
            raise
        self.start = self._start_state(restored[0] if restored else None)
        """The state this run begins from (fresh, or the restored checkpoint)."""
        self.checkpoints = RunCheckpoints(
            cfg, spec, run_dir, metrics, self.start, factory_record(envs.factory)
        )
        self.learner.on_update = self._after_update
        sink = PlacingSink(pipeline, placement.place)
        # Actors and the evaluator act with published snapshots; with observation
        # normalization these carry the statistics, applied inside the jitted policy.
        apply = acting_apply(network.apply, cfg.normalize)
        fns, greedy = make_policy_fns(apply), make_greedy_policy(apply)
        published = local_copy(self.learner.acting_params())

        compile_start = time.perf_counter()
        dummies = {}
        for device in devices.actors:
            lifetime.check()
            dummies[device] = placement.place(dummy_trajectory(cfg, spec, device))
        lifetime.check()
        # Each actor's dummy from its own device: its rollouts' shardings, compiled for.
        warm_up_learner(
            self.learner, [dummies[self._actor_device(i)] for i in range(cfg.num_actors)]
        )
        self.compile_s = time.perf_counter() - compile_start

        try:
            self._build_acting(envs, fns, greedy, sink, published, first)
        except BaseException:
            self.close_envs()  # the envs built so far (their subprocesses, threads)
            raise

    def _build_acting(self, envs: EnvSource, fns, greedy, sink, published, first: int) -> None:
        """Build and warm up the actors and the evaluator (each builds its envs)."""
        cfg, lifetime, devices, publisher = self.cfg, self.lifetime, self.devices, self.publisher
        metrics, watchdog = self.metrics, self.watchdog

        def control(name: str) -> Control:
            return Control(lifetime, watchdog.heartbeat(name), metrics.add_many)

        for actor_id in range(cfg.num_actors):
            lifetime.check()
            device = self._actor_device(actor_id)
            params = publisher.subscribe(device=device, name=f"actor-{actor_id}")
            actor_control = control(f"actor-{actor_id}")
            self.actors.append(
                build_actor(
                    cfg,
                    actor_id,
                    fns.on(device),
                    params,
                    sink,
                    actor_control,
                    envs=envs,
                    first_seq=first,
                    key=self.start.actor_keys[actor_id],
                )
            )
        compile_start = time.perf_counter()
        for actor in self.actors:
            lifetime.check()
            actor.warm_up(published)
        self.compile_s += time.perf_counter() - compile_start
        params = publisher.subscribe(device=devices.evaluator, name="evaluator")
        self.evaluator = build_evaluator(
            cfg, greedy, devices.evaluator, params, metrics, control("evaluator"), envs=envs
        )
        compile_start = time.perf_counter()
        lifetime.check()
        self.evaluator.warm_up(published)
        self.compile_s += time.perf_counter() - compile_start

    def _actor_device(self, actor_id: int) -> jax.Device:
        return self.devices.actors[actor_id // self.cfg.layout.actors_per_device]

    def _start_state(self, restored: RunState | None) -> RunState:
        """A fresh run's first state, or a restored one with counters, clock and skip count
        carried into this run and actor keys folded with the resume version (the envs restart,
        so replaying the saved keys would not continue anything)."""
        cfg, learner, n = self.cfg, self.learner, self.cfg.num_actors
        if restored is None:
            keys = np.stack([np.asarray(jax.device_get(actor_key(cfg, i))) for i in range(n)])
            return RunState(
                learner.state, learner.keys, keys, (0,) * n, 0, 0, 0, learner.normalizer
            )
        version = restored.version
        if tuple(restored.actor_next_seq) != (version,) * n:
            raise ConfigError(
                f"checkpoint {version} has actors' next rollouts {list(restored.actor_next_seq)}; "
                f"the thread runtime resumes only where every actor continues at {version}"
            )
        keys = np.stack(
            [
                np.asarray(jax.device_get(jax.random.fold_in(k, version)))
                for k in restored.actor_keys
            ]
        )
        m = self.metrics
        m.count("env_steps", restored.env_steps)
        m.count("episodes", restored.episodes)
        m.count("learner/skipped_nonfinite", restored.skipped_updates)
        m.set("version", version)
        learner.skipped = restored.skipped_updates
        self.time_offset = restored.time_s
        return RunState(
            learner.state,
            learner.keys,
            keys,
            restored.actor_next_seq,
            version,
            restored.env_steps,
            restored.episodes,
            learner.normalizer,
            restored.time_s,
            restored.skipped_updates,
        )

    def _clock(self) -> float:
        """Training seconds: this run's since its threads started, plus the runs before it."""
        return self.time_offset + time.perf_counter() - self._train_start

    def _after_update(self, version: int) -> None:
        every = self.cfg.eval.every_updates
        if self.evaluates and every and version % every == 0 and version < self.cfg.num_updates:
            self.evaluator.request(version)
        m, learner = self.metrics, self.learner
        state = RunState(
            learner.state,
            learner.keys,
            self.start.actor_keys,
            (version,) * self.cfg.num_actors,
            version,
            int(m.total("env_steps")),
            int(m.total("episodes")),
            learner.normalizer,
            self._clock(),
            learner.skipped,
        )
        self.checkpoints.record(state, self.lifetime)

    def run(self) -> TrainResult:
        cfg, lifetime, metrics = self.cfg, self.lifetime, self.metrics
        final: list[EvalResult] = []
        learned: list[float] = []

        def learn() -> None:
            self.learner.run()
            learned.append(time.perf_counter() - train_start)
            if self.evaluates:
                final.append(self.evaluator.evaluate_final(self.learner.version))
            lifetime.stop("finished")

        self.checkpoints.open()
        try:
            log = RunLog(cfg, self.run_dir, metrics, lifetime, self._sync_metrics, self.time_offset)
        except BaseException:
            self.checkpoints.close(lifetime)
            raise
        log.sinks.extend(self.extra_sinks)

        group = ThreadGroup(lifetime)
        self._train_start = train_start = time.perf_counter()
        try:
            for actor in self.actors:
                group.spawn(f"actor-{actor.actor_id}", actor.run)
            if self.evaluates:
                group.spawn("evaluator", self.evaluator.run)
            group.spawn("learner", learn)
            group.spawn("watchdog", self.watchdog.run, guard_transfers=False)
            log.until_stopped(train_start)
        finally:  # also on KeyboardInterrupt: stop, join, flush, then let it propagate
            try:
                lifetime.stop("shutdown")
                self._save_final(group)
                self.stuck = stuck = group.join(STOP_GRACE_S)
                train_s = time.perf_counter() - train_start
                if (
                    lifetime.stop_reason == "finished"
                ):  # the final line then names the final checkpoint
                    self.checkpoints.settle(FINAL_SAVE_WAIT_S)
                log.write(train_start, final=True)
                log.close()
                self.checkpoints.close(lifetime)  # before user code (env.close) runs again
                closing = self.close_envs(exclude=stuck)
                if stuck and lifetime.stop_reason == "finished":
                    lifetime.fail(
                        "runtime",
                        TimeoutError(f"threads did not stop within {STOP_GRACE_S}s: {stuck}"),
                    )
                elif closing and lifetime.stop_reason == "finished":
                    lifetime.fail(
                        "runtime",
                        TimeoutError(
                            f"env.close() did not return within {threads.ENV_CLOSE_GRACE_S:g}s: "
                            f"{', '.join(c.removesuffix(' env.close') for c in closing)}"
                        ),
                    )
                stuck += closing
            finally:  # also when a second KeyboardInterrupt cut the above short
                if self.lock is not None:
                    self.lock.release()
                if lifetime.failure is None and lifetime.stop_reason != "finished":
                    discard_if_untrained(lifetime.run_dir, self.learner.version)
        if lifetime.failure is not None:
            raise lifetime.failure
        return TrainResult(
            run_dir=self.run_dir,
            updates=self.learner.version,
            env_steps=int(metrics.total("env_steps")),
            compile_s=self.compile_s,
            train_s=train_s,
            learn_s=learned[0] if learned else train_s,
            final_eval=final[0] if final else None,
            max_policy_lag=float(metrics.last("lag/max_seen", 0.0)),
            skipped_updates=self.learner.skipped,
            checkpoint=self.checkpoints.latest,
        )

    def close_envs(self, exclude: list[str] = ()) -> list[str]:
        """Close the envs of the components built so far, except those of threads in
        `exclude` (stuck inside an env call: closing under it can crash the process);
        see `close_envs` for errors and closes that block."""
        envs = [(f"actor-{actor.actor_id}", actor.env) for actor in self.actors]
        if self.evaluator is not None:
            envs.append(("evaluator", self.evaluator.env))
        return close_envs((owner, env) for owner, env in envs if owner not in exclude)

    def _save_final(self, group: ThreadGroup) -> None:
        """Start the last save as soon as the learner thread has returned (before the other
        threads are joined: after a signal the process has little time left), unless the
        learner is stuck or checkpointing itself is what failed."""
        learner = [t for t in group.threads if t.name == "learner"]
        if not learner:
            return
        learner[0].join(STOP_GRACE_S)
        failure = self.lifetime.failure
        if not learner[0].is_alive() and (failure is None or failure.component != "checkpoint"):
            self.checkpoints.save_final(self.lifetime)

    def _sync_metrics(self) -> dict[str, float]:
        return {f"sync/{k}": v for k, v in self.publisher.metrics().items()}


__all__ = ["STOP_GRACE_S", "SingleHostRun", "TrainResult", "prepare", "train"]
