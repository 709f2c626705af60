"""One run, every topology: the skeleton that thread, Ray and multi-host runs share.

`prepare` does everything that can fail because of the request before any thread starts:

1. check the config (and, resuming, the checkpoint and the changes asked for);
2. the topology joins its cluster (Ray, jax.distributed), which may resolve the config;
3. check the envs' spaces, the metrics sinks, the devices and the memory needed;
4. claim the run directory: create it and write config.json (a fresh run) or take the
   checkpoint's run back (a resume); either way hold its lock;
5. build the learner (restored from the checkpoint when resuming), its publisher and the
   pipeline, and compile the update; the topology builds and starts its actors meanwhile;
6. build the evaluator; a resume then makes the run directory the resumed run's.

`Run.run` starts the loops and writes metric lines until the learner finishes, something
fails or a stop comes; it then saves the last state, joins every thread, writes the last
line and returns a `TrainResult`. A topology (`podrace.runtime.topology`) says only where
things run; everything here reaches every topology.

Shutdown: on a stop (end of training, a failure, a signal) every thread is given the
topology's `stop_grace_s` to return. A thread still alive after that is stuck in foreign
code (an env call that ignores the stop): it is left behind as a daemon thread, its envs
are not closed (closing an env under a running call can crash the process), and its name
is kept in `Run.stuck` so that a CLI can exit the process without waiting for it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from podrace.actor import make_policy_fns
from podrace.algos.normalizer import acting_apply
from podrace.checkpoints.read import restore
from podrace.checkpoints.resume import Resume, ResumePoint, commit, resume_point, resumed_envs
from podrace.checkpoints.saving import RunCheckpoints
from podrace.checkpoints.state import RunState, checkpoint_dir
from podrace.config import ConfigError, TrainConfig, distributed_requested, replace, resolved
from podrace.control import (
    Control,
    Lifetime,
    Stopped,
    Watchdog,
    raise_stopped_if_stopping,
)
from podrace.envs import EnvSource, closing, env_warnings_silenced
from podrace.envs.closing import close_envs
from podrace.envs.source import factory_record
from podrace.evaluate import EvalResult, make_greedy_policy
from podrace.metrics.loggers import Sink, check_sinks
from podrace.metrics.registry import Metrics
from podrace.networks import make_network
from podrace.rundir import RunLock, claim_new_run_dir, discard_run_dir
from podrace.runtime.build import build_evaluator, build_learner, warm_up_learner
from podrace.runtime.faults import FaultPlan, Faults
from podrace.runtime.interrupts import interrupts_stop
from podrace.runtime.memory import check_fits
from podrace.runtime.run_log import RunLog
from podrace.runtime.threads.group import ThreadGroup
from podrace.runtime.topology import Topology
from podrace.runtime.xla_setup import deterministic_gpu_ops
from podrace.sync.base import ChannelClosed
from podrace.sync.versions import finish_releases
from podrace.validation import check_types, validate

FINAL_SAVE_WAIT_S = 1.0
"""How long a run that finished waits for its final save before writing its final metrics
line (so that line names that checkpoint): less than the CLI's exit grace, so a signal
that comes meanwhile still leaves time for the line."""


@dataclass(frozen=True)
class TrainResult:
    """What a run returns, whatever its topology."""

    run_dir: Path
    """This process's run directory (process i > 0 of a multi-host run: its own part)."""
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
    """Updates skipped as non-finite (safety.on_nonfinite=skip), the run's earlier parts
    included."""
    checkpoint: int | None = None
    """Version of the run's latest complete checkpoint: the last this run wrote, else the
    one it resumed from (None: none)."""
    topology: str = "threads"
    """`threads`, `ray` or `multihost`."""
    ray: Any = None
    """The Ray topology's report (`podrace.runtime.ray.topology.RayReport`); else None."""


def topology_for(cfg: TrainConfig) -> Topology:
    """The topology `cfg` asks for: Ray workers, several processes, or threads."""
    if cfg.runtime == "ray":
        if distributed_requested(cfg):
            raise ConfigError(
                "--runtime ray cannot be combined with --distributed.*: run one learner process"
            )
        if cfg.layout.inference == "server":  # env-only Ray workers, served from here
            from podrace.runtime.ray.served import RayServedTopology

            return RayServedTopology()
        from podrace.runtime.ray.topology import RayTopology

        return RayTopology()
    if distributed_requested(cfg):
        from podrace.runtime.multihost.topology import MultiHostTopology

        return MultiHostTopology()
    from podrace.runtime.threads.topology import ThreadTopology

    return ThreadTopology()


def train(
    cfg: TrainConfig | None,
    lifetime: Lifetime | None = None,
    envs: EnvSource | None = None,
    resume: Resume | None = None,
    faults: FaultPlan | None = None,
) -> TrainResult:
    """Prepare and run any topology, then leave the run's other processes; ConfigError
    before anything starts. Ctrl-C in a library caller's main thread stops the run cleanly
    (`interrupts_stop`) and raises KeyboardInterrupt once it has stopped."""
    lifetime = lifetime or Lifetime()
    with interrupts_stop(lifetime) as interrupted:
        return run_to_end(cfg, lifetime, interrupted, envs, resume, faults)


def run_to_end(
    cfg: TrainConfig | None,
    lifetime: Lifetime,
    interrupted: Callable[[], int | None],
    envs: EnvSource | None = None,
    resume: Resume | None = None,
    faults: FaultPlan | None = None,
) -> TrainResult:
    """`train` for a caller that watches signals itself (`interrupted()`: the signal
    received so far)."""
    with env_warnings_silenced():  # as the CLI does
        try:
            run = prepare(cfg, lifetime, envs, resume, faults=faults)
            ok = False
            try:
                result = run.run()
                run.topology.leave(interrupted)
                ok = not interrupted()
            finally:
                run.topology.shutdown(ok)
        finally:
            finish_releases()  # the caller's process keeps no thread of the run
    return result


def prepare(
    cfg: TrainConfig | None,
    lifetime: Lifetime | None = None,
    envs: EnvSource | None = None,
    resume: Resume | None = None,
    topology: Topology | None = None,
    faults: FaultPlan | None = None,
) -> Run:
    """Validate, join, claim the run directory, build and compile everything; no thread
    is started yet (`Run.run` does).

    `lifetime` lets a caller stop the run from outside (a signal); a stop during
    preparation raises `Stopped` between steps. `envs` is where actors and the evaluator
    get their envs (a user's env factory); by default `cfg.env.id` through its backend.
    With `resume`, the run continues the one in `resume.run_dir` from a checkpoint; `cfg`
    is then None (the checkpoint's config) or that config with the changes
    `podrace.checkpoints.resume.RESUMABLE` allows. `topology` defaults to the one the
    config asks for; `faults` injects failures for tests and drills.
    """
    lifetime = lifetime or Lifetime()
    if cfg is not None:
        check_types(cfg)
    lock = point = None
    try:
        if resume is not None:
            if Path(resume.run_dir).is_dir() and not _maybe_distributed(cfg, resume):
                # Held before the resume point is read: a run still writing there (or
                # another resume) would change it under us.
                lock = RunLock(resume.run_dir)
            point = resume_point(resume, cfg)
            cfg = point.cfg
        validate(cfg)
        cfg = resolved(cfg)  # what `deterministic` implies, shorthands written out
        topology = topology or topology_for(cfg)
        topology.check(cfg)
        if envs is not None:
            topology.check_envs(envs)
    except BaseException as error:
        if lock is not None:
            lock.release()
        if isinstance(error, ConfigError) and cfg is not None and distributed_requested(cfg):
            from podrace.runtime.multihost.distributed import refuse_to_join

            refuse_to_join(cfg.distributed, str(error))  # the others wait for this one
        raise
    run_dir = None
    try:
        cfg = topology.join(cfg, lifetime, resuming=point is not None)
        envs = resumed_envs(point, envs) if point is not None else envs or EnvSource(cfg.env)
        spec = envs.spec()  # the backend (or the factory) is checked first
        check_sinks(cfg.log)
        if cfg.deterministic:  # the CLI has set it; a library caller may not have
            deterministic_gpu_ops()
        devices = topology.devices(cfg)
        check_fits(cfg, make_network(cfg.network, spec), spec, devices)
        lifetime.check()
        if lock is None and point is not None:
            lock = topology.lock_resumed(point)
        run_dir, root = topology.claim_run_dir(cfg, lifetime, point)
        if point is None:  # last: nothing is written unless every check passed
            cfg = replace(cfg, **{"log.run_name": root.name})
            lock = claim_new_run_dir(run_dir, cfg)
        run = Run(topology, cfg, spec, devices, run_dir, root, lifetime, envs, point, faults)
        run.lock = lock
        if point is not None:  # the run directory changes only once the run is fully built
            try:
                written = commit(point, run.start.version, run.start.env_steps, cfg, run_dir)
            except BaseException:
                run.close_envs()
                raise
            run.time_offset = max(run.time_offset, written)
        return run
    except BaseException as error:
        topology.abandon(error)
        if lock is not None:
            lock.release()
        if point is None and lifetime.run_dir is not None:
            discard_run_dir(lifetime.run_dir)
        raise_stopped_if_stopping(lifetime, error)
        raise


def _maybe_distributed(cfg: TrainConfig | None, resume: Resume) -> bool:
    """Whether a resume may belong to several processes: their run directory is locked once
    each process knows which part is its own (after joining)."""
    if cfg is not None:
        return distributed_requested(cfg)
    return bool(os.environ.get("JAX_COORDINATOR_ADDRESS"))


class Run:
    """Every component of one run, wired together; `run()` starts the threads."""

    def __init__(
        self,
        topology: Topology,
        cfg: TrainConfig,
        spec,
        devices,
        run_dir: Path,
        root: Path,
        lifetime: Lifetime,
        envs: EnvSource,
        point: ResumePoint | None = None,
        faults: FaultPlan | None = None,
    ):
        self.topology = topology
        self.cfg, self.spec, self.devices, self.envs = cfg, spec, devices, envs
        self.run_dir, self.root = run_dir, root
        self.lifetime = lifetime
        self.faults = Faults(faults or FaultPlan(), lifetime)
        self.metrics = metrics = Metrics()
        self.watchdog = Watchdog(lifetime, cfg.safety.watchdog_s)
        self.stuck: list[str] = []
        self.evaluator = None
        self.lock: RunLock | None = None
        """This process's hold on `run_dir`, released when `run()` returns."""
        self.extra_sinks: list[Sink] = list(self.faults.sinks())
        """Metrics sinks a caller adds before `run()` (after the configured ones)."""
        self.time_offset = 0.0
        """Seconds of training before this run (a resumed run's clock continues)."""
        self._saved_last = False
        """The learner thread started saving the last update's state."""
        self.saving_last = False
        """The run stopped and is saving its last checkpoint (agreeing on its version with
        the other processes, writing it): the CLI lets that outlive its exit grace after a
        signal (up to `supervisor.LAST_SAVE_S` more)."""
        self._train_start = time.perf_counter()
        self.network = network = make_network(cfg.network, spec)
        first = point.step if point is not None else 0
        self.pipeline = topology.pipeline(self, first)
        self.publisher = publisher = topology.publisher(self, first)
        lifetime.on_stop(publisher.close)
        restored: list[RunState] = []

        def from_checkpoint(state, keys, normalizer):
            start = time.perf_counter()
            saved = topology.saved_actors(self)
            like = RunState(
                state, keys, np.zeros((saved, 2), np.uint32), (0,) * saved, 0, 0, 0, normalizer
            )
            restored.append(restore(checkpoint_dir(root), like, spec, first, topology.writer()))
            metrics.set("checkpoint/restore_s", time.perf_counter() - start)
            return restored[0].train_state, restored[0].learner_keys, restored[0].normalizer

        try:
            self.learner, self.placement = build_learner(
                cfg,
                spec,
                network,
                devices.learners,
                self.pipeline,
                publisher,
                metrics,
                lifetime,
                restore=from_checkpoint if point is not None else None,
                wrap_update=self.faults.update,
            )
        except ChannelClosed:  # a stop closed the publisher before the first publish
            lifetime.check()
            raise
        self.start = self._start_state(restored[0] if restored else None)
        """The state this run begins from (fresh, or the restored checkpoint)."""
        self.checkpoints = RunCheckpoints(
            cfg, spec, root, metrics, self.start, topology.writer(), factory_record(envs.factory)
        )
        self.learner.on_update = self._after_update
        # Actors and the evaluator act with published snapshots; with observation
        # normalization these carry the statistics, applied inside the jitted policy.
        apply = acting_apply(network.apply, cfg.normalize)
        self.policy_fns, self.greedy = make_policy_fns(apply), make_greedy_policy(apply)
        self.published = topology.published(self.learner.acting_params())

        compile_start = time.perf_counter()
        try:
            topology.launch_actors(self)  # Ray workers compile meanwhile
            lifetime.check()
            warm_up_learner(self.learner, topology.learner_dummies(self))
            topology.actors_ready(self)
            if topology.evaluates:
                self._build_evaluator()
        except BaseException:
            self.close_envs()  # the envs built so far (their subprocesses, threads)
            raise
        self.compile_s = time.perf_counter() - compile_start

    @property
    def actors(self) -> list:
        """The actors this process runs in threads (none where they are remote workers)."""
        return getattr(self.topology, "actors", [])

    def control(self, name: str) -> Control:
        """A loop's stop check, heartbeat (watched by the run's watchdog) and metrics."""
        return Control(self.lifetime, self.watchdog.heartbeat(name), self.metrics.add_many)

    def _build_evaluator(self) -> None:
        self.lifetime.check()
        device = self.devices.evaluator
        params = self.publisher.subscribe(device=device, name="evaluator")
        self.evaluator = build_evaluator(
            self.cfg,
            self.greedy,
            device,
            params,
            self.metrics,
            self.control("evaluator"),
            envs=self.envs,
            wrap_env=self.faults.env,
        )
        self.lifetime.check()
        self.evaluator.warm_up(self.published)

    def _start_state(self, restored: RunState | None) -> RunState:
        """A fresh run's first state, or a restored one with this process's counters
        (every running total: env steps, episodes, restarts, ...), clock and skip count
        carried into this run, and the checkpoint it stands on named in the metrics; the
        topology says where its actors start. (The learner was built from the restored
        state: `build_learner`'s `restore`.)"""
        actors = self.topology.actors_start(self, restored)
        m = self.metrics
        m.set("version", self.learner.version)  # every metrics line names a version
        if restored is not None:
            for name, total in restored.counters.items():
                m.count(name, total)
            m.set("checkpoint/version", restored.version)  # complete, and the run's latest
            self.learner.skipped = restored.skipped_updates
            self.time_offset = restored.time_s
        return RunState(
            **self.learner.saved(), **actors, **self._counters(self.learner.version, start=True)
        )

    def _counters(self, version: int, start: bool = False) -> dict:
        """What a checkpoint keeps of the run itself: its version, this process's running
        totals (env steps and episodes among them) and training clock."""
        totals = self.metrics.totals()
        return {
            "version": version,
            "env_steps": int(totals.get("env_steps", 0)),
            "episodes": int(totals.get("episodes", 0)),
            "time_s": self.time_offset if start else self._clock(),
            "counters": totals,
        }

    def _clock(self) -> float:
        """Training seconds: this run's since its threads started, plus the runs before it."""
        return self.time_offset + time.perf_counter() - self._train_start

    def _after_update(self, version: int) -> None:
        every = self.cfg.eval.every_updates
        if self.evaluator is not None and every and version % every == 0:
            if version < self.cfg.num_updates:
                self.evaluator.request(version)
        state = RunState(
            **self.learner.saved(),
            **self.topology.actors_saved(self, version),
            **self._counters(version),
        )
        self.checkpoints.record(state, self.lifetime)

    def run(self) -> TrainResult:
        cfg, lifetime, metrics, topology = self.cfg, self.lifetime, self.metrics, self.topology
        final: list[EvalResult] = []
        learned: list[float] = []

        def learn() -> None:
            try:
                self.learner.run()
            except (Stopped, ChannelClosed):
                raise
            except Exception as error:
                explained = topology.explain(error)
                if explained is error:
                    raise
                raise explained from error
            learned.append(time.perf_counter() - train_start)
            # The last update's state is saved now, in every process at once (a
            # multi-process save is collective), and written while the final evaluation runs.
            self._save_last(self.learner.version)
            self._saved_last = True
            if self.evaluator is not None:
                final.append(self.evaluator.evaluate_final(self.learner.version))
            lifetime.stop("finished")

        try:
            self.checkpoints.open()
            try:
                log = RunLog(
                    cfg, self.run_dir, metrics, lifetime, self._line_extras, self.time_offset
                )
            except BaseException:
                self.checkpoints.close(lifetime)
                raise
        except BaseException:
            self._release()
            raise
        log.sinks.extend(self.extra_sinks)

        group = ThreadGroup(lifetime)
        self._train_start = train_start = time.perf_counter()
        try:
            topology.starting(self)
            for name, loop in topology.loops(self):
                group.spawn(name, loop)
            if self.evaluator is not None:
                group.spawn("evaluator", self.evaluator.run)
            group.spawn("learner", learn)
            group.spawn("watchdog", self.watchdog.run, guard_transfers=False)
            log.until_stopped(train_start)
        finally:  # also on KeyboardInterrupt: stop, join, flush, then let it propagate
            try:
                self.saving_last = True
                lifetime.stop("shutdown")
                topology.stopping(self)
                self._save_final(group)
                self.stuck = stuck = group.join(topology.stop_grace_s)
                train_s = time.perf_counter() - train_start
                if lifetime.stop_reason == "finished":  # the last line names the last save
                    self.checkpoints.settle(FINAL_SAVE_WAIT_S)
                if not self._discarded():
                    log.write(train_start, final=True)
                log.close()
                self.checkpoints.close(lifetime)  # before user code (env.close) runs again
                self.saving_last = False
                unclosed = self.close_envs(exclude=stuck)
                if lifetime.stop_reason == "finished" and (stuck or unclosed):
                    what = (
                        f"threads did not stop within {topology.stop_grace_s}s: {stuck}"
                        if stuck
                        else f"env.close() did not return within {closing.ENV_CLOSE_GRACE_S:g}s: "
                        f"{', '.join(c.removesuffix(' env.close') for c in unclosed)}"
                    )
                    lifetime.fail("runtime", TimeoutError(what))
                stuck += unclosed
            finally:  # also when a second KeyboardInterrupt cut the above short
                self._release()
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
            topology=topology.name,
            ray=topology.report(self),
        )

    def _discarded(self) -> bool:
        """Whether the run directory goes as the run ends: a new run stopped before its first
        update (its directory may be gone already: another process of the run removed it)."""
        lifetime = self.lifetime
        return (
            lifetime.run_dir is not None
            and lifetime.failure is None
            and lifetime.stop_reason != "finished"
            and not self.learner.version
        )

    def _release(self) -> None:
        """The topology's resources, the run directory's lock, and a run directory that
        holds no update (it could not be resumed). The checkpoint writer is closed first
        (a no-op unless a second KeyboardInterrupt cut the stop short): the lock is held
        until no write goes on in the directory."""
        lifetime = self.lifetime
        try:
            try:
                self.checkpoints.close(lifetime)
            finally:
                self.topology.close()
        finally:
            if self.lock is not None:
                self.lock.release()
            if self._discarded():
                discard_run_dir(lifetime.run_dir)

    def close_envs(self, exclude: list[str] = ()) -> list[str]:
        """Close the envs of the components built so far, except those of threads in
        `exclude` (stuck inside an env call: closing under it can crash the process);
        see `close_envs` for errors and closes that block."""
        envs = list(self.topology.env_owners(self))
        if self.evaluator is not None:
            envs.append(("evaluator", self.evaluator.env))
        return close_envs((owner, env) for owner, env in envs if owner not in exclude)

    def _save_final(self, group: ThreadGroup) -> None:
        """Start the last save as soon as the learner thread has returned (before the other
        threads are joined: after a signal the process has little time left), unless the
        learner saved it already (it finished every update), is stuck, checkpointing itself
        is what failed, or the topology cannot save now (a lost process)."""
        learner = [t for t in group.threads if t.name == "learner"]
        if not learner or self._saved_last:
            return
        learner[0].join(self.topology.stop_grace_s)
        failure = self.lifetime.failure
        if failure is not None and failure.component == "checkpoint":
            return
        version = self.topology.final_version(self, returned=not learner[0].is_alive())
        if version is not None:
            self._save_last(version)

    def _save_last(self, version: int) -> None:
        """Start the last save: the recorded state of `version`, with the actors' restarts
        as they are now (a Ray worker restarted after that update is an incarnation too)."""
        restarts = self.topology.actors_saved(self, version)["actor_restarts"]
        self.checkpoints.save_final(self.lifetime, version, restarts)

    def _line_extras(self) -> dict[str, float]:
        extras = {f"sync/{k}": v for k, v in self.publisher.metrics().items()}
        extras.update(self.topology.line_extras(self))
        return extras


__all__ = [
    "Run",
    "TrainResult",
    "prepare",
    "run_to_end",
    "topology_for",
    "train",
]
