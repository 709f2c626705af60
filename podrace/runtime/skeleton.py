"""The run skeleton every topology shares: `Run`, one run's components wired together.

`podrace.runtime.run.prepare` builds it once the cluster joined and the run directory was
claimed: the learner (restored from a checkpoint when resuming), the fleet's publisher,
pipeline and actors (compiled while the learner compiles), the evaluator. `Run.run` starts
the loops and writes metric lines until the learner finishes, something fails or a stop
comes; it then saves the last state, joins every thread, writes the last line and returns
a `TrainResult`. Everything here reaches every cluster and fleet.

Shutdown: on a stop (end of training, a failure, a signal) every thread is given the
cluster's `stop_grace_s` to return. A thread still alive after that is stuck in foreign
code (an env call that ignores the stop): it is left behind as a daemon thread, its envs
are not closed (closing an env under a running call can crash the process), and its name
is kept in `Run.stuck` so that a CLI can exit the process without waiting for it.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from podrace.actor import make_policy_fns
from podrace.algos.normalizer import acting_apply
from podrace.checkpoints.read import restore
from podrace.checkpoints.resume import ResumePoint
from podrace.checkpoints.saving import RunCheckpoints
from podrace.checkpoints.state import RunState, checkpoint_dir
from podrace.config import TrainConfig
from podrace.control import Control, Lifetime, Stopped, Watchdog
from podrace.envs import EnvSource, closing
from podrace.envs.closing import close_envs
from podrace.envs.source import factory_record
from podrace.evaluate import EvalResult, make_greedy_policy
from podrace.metrics.loggers import Sink
from podrace.metrics.registry import Metrics
from podrace.networks import make_network
from podrace.rundir import RunLock, discard_run_dir
from podrace.runtime.build import build_evaluator, build_learner, warm_up_learner
from podrace.runtime.faults import FaultPlan, Faults
from podrace.runtime.fleet import FleetContext
from podrace.runtime.result import TrainResult
from podrace.runtime.run_log import RunLog
from podrace.runtime.threads.group import ThreadGroup
from podrace.runtime.topology import Topology
from podrace.sync.base import ChannelClosed

FINAL_SAVE_WAIT_S = 1.0
"""How long a run that finished waits for its final save before writing its final metrics
line (so that line names that checkpoint): less than the CLI's exit grace, so a signal
that comes meanwhile still leaves time for the line."""


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
        self.cluster, self.fleet = cluster, fleet = topology.cluster, topology.fleet
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
        """The run stopped and is saving its last checkpoint (agreeing on its version, writing
        it): the CLI lets that outlive its exit grace (by `supervisor.LAST_SAVE_S`)."""
        self._train_start = time.perf_counter()
        self.network = network = make_network(cfg.network, spec)
        first = point.step if point is not None else 0
        self.pipeline = fleet.pipeline(cfg, lifetime, first)
        self.publisher = publisher = fleet.publisher(first)
        lifetime.on_stop(publisher.close)
        restored: list[RunState] = []

        def from_checkpoint(state, keys, normalizer):
            start = time.perf_counter()
            saved = fleet.saved_actor_count(cfg, cluster.num_processes)
            like = RunState(
                state, keys, np.zeros((saved, 2), np.uint32), (0,) * saved, 0, 0, 0, normalizer
            )
            restored.append(restore(checkpoint_dir(root), like, spec, first, cluster.writers()))
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
        # Actors and the evaluator act with published snapshots; with observation
        # normalization these carry the statistics, applied inside the jitted policy.
        apply = acting_apply(network.apply, cfg.normalize)
        self.policy_fns, self.greedy = make_policy_fns(apply), make_greedy_policy(apply)
        self.published = fleet.published(self.learner.acting_params())
        self.start = self._start_state(restored[0] if restored else None)
        """The state this run begins from (fresh, or the restored checkpoint)."""
        self.checkpoints = RunCheckpoints(
            cfg, spec, root, metrics, self.start, cluster.writers(), factory_record(envs.factory)
        )
        self.learner.on_update = self._after_update

        compile_start = time.perf_counter()
        try:
            fleet.start()  # Ray workers compile meanwhile
            lifetime.check()
            dummies = fleet.learner_dummies()
            # The update and the evaluator compile in threads of their own while this one
            # builds and compiles the actors: XLA releases the GIL while it compiles, so the
            # compiles share the cores instead of queueing. Leaving the block waits for both.
            with ThreadPoolExecutor(2, thread_name_prefix="podrace-compile") as pool:
                built = [pool.submit(warm_up_learner, self.learner, dummies)]
                if cluster.process_id == 0:  # one process of a run evaluates
                    built.append(pool.submit(self._build_evaluator))
                fleet.ready()
                for done in built:
                    done.result()
        except BaseException:
            self.close_envs()  # the envs built so far (their subprocesses, threads)
            raise
        self.compile_s = time.perf_counter() - compile_start

    @property
    def actors(self) -> list:
        """The actors this process runs in threads (none where they are remote workers)."""
        return getattr(self.fleet, "actors", [])

    def _fleet_context(self) -> FleetContext:
        return FleetContext(
            cfg=self.cfg,
            spec=self.spec,
            envs=self.envs,
            devices=self.devices,
            lifetime=self.lifetime,
            metrics=self.metrics,
            pipeline=self.pipeline,
            publisher=self.publisher,
            placement=self.placement,
            network=self.network,
            policy_fns=self.policy_fns,
            published=self.published,
            control=self.control,
            heartbeat=self.watchdog.heartbeat,
            faults=self.faults,
            topology=self.topology.name,
            process_id=self.cluster.process_id,
            num_processes=self.cluster.num_processes,
            version=lambda: self.learner.version,
        )

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
        """A fresh run's first state, or a restored one with this process's running totals,
        clock and skip count carried on and its checkpoint named in the metrics; the fleet
        says where its actors start."""
        actors = self.fleet.restore(self._fleet_context(), restored)
        m = self.metrics
        m.set("version", self.learner.version)  # every metrics line names a version
        m.count("env_steps", 0)  # and the env steps so far, 0 before the first rollout
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
            **self.fleet.save(version),
            **self._counters(version),
        )
        self.checkpoints.record(state, self.lifetime)

    def run(self) -> TrainResult:
        cfg, lifetime, metrics, cluster = self.cfg, self.lifetime, self.metrics, self.cluster
        final: list[EvalResult] = []
        learned: list[float] = []

        def learn() -> None:
            try:
                self.learner.run()
            except (Stopped, ChannelClosed):
                raise
            except Exception as error:
                explained = cluster.explain(error)
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
            cluster.watch(lifetime)
            for name, loop in self.fleet.loops():
                group.spawn(name, loop)
            if self.evaluator is not None:
                group.spawn("evaluator", self.evaluator.run)
            group.spawn("learner", learn)
            group.spawn("watchdog", self.watchdog.run, guard_transfers=False)
            log.until_stopped(train_start)
        finally:  # also on KeyboardInterrupt: stop, join, flush, then let it propagate
            try:
                self.saving_last = True
                lifetime.stop("shutdown")  # the fleet's workers are told too (`on_stop`)
                self._save_final(group)
                self.stuck = stuck = group.join(cluster.stop_grace_s)
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
                        f"threads did not stop within {cluster.stop_grace_s}s: {stuck}"
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
            topology=self.topology.name,
            ray=self.fleet.report(),
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
        """Release the checkpoint writer (a no-op unless a second KeyboardInterrupt cut the
        stop short: the lock is held until no write goes on), the fleet, the cluster, the
        run directory's lock, and a run directory that holds no update."""
        with contextlib.ExitStack() as release:  # last first; each even if one before raised
            release.callback(lambda: self._discarded() and discard_run_dir(self.lifetime.run_dir))
            if self.lock is not None:
                release.callback(self.lock.release)
            release.callback(self.cluster.release, self.learner.version)
            release.callback(self.fleet.close)
            release.callback(self.checkpoints.close, self.lifetime)

    def close_envs(self, exclude: list[str] = ()) -> list[str]:
        """Close the envs built so far but those of threads in `exclude` (stuck in an env
        call: closing under it can crash the process); see `close_envs`."""
        envs = list(self.fleet.env_owners())
        if self.evaluator is not None:
            envs.append(("evaluator", self.evaluator.env))
        return close_envs((owner, env) for owner, env in envs if owner not in exclude)

    def _save_final(self, group: ThreadGroup) -> None:
        """Start the last save as soon as the learner thread has returned (before the other
        threads are joined: after a signal the process has little time left), unless the
        learner saved it already (it finished every update), is stuck, checkpointing itself
        is what failed, or the cluster cannot save now (a lost process)."""
        learner = [t for t in group.threads if t.name == "learner"]
        if not learner or self._saved_last:
            return
        learner[0].join(self.cluster.stop_grace_s)
        failure = self.lifetime.failure
        if failure is not None and failure.component == "checkpoint":
            return
        checkpoints = self.checkpoints
        version = self.cluster.last_save_version(
            checkpoints.point.version, not learner[0].is_alive(), checkpoints.abandon
        )
        if version is not None:
            self._save_last(version)

    def _save_last(self, version: int) -> None:
        """Start the last save: the recorded state of `version`, with the actors' restarts
        as they are now (a Ray worker restarted after that update is an incarnation too)."""
        restarts = self.fleet.save(version)["actor_restarts"]
        self.checkpoints.save_final(self.lifetime, version, restarts)

    def _line_extras(self) -> dict[str, float]:
        extras = {f"sync/{k}": v for k, v in self.publisher.metrics().items()}
        extras.update(self.fleet.line_extras())
        return extras


__all__ = ["FINAL_SAVE_WAIT_S", "Run", "TrainResult"]
