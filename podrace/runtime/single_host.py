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


from podrace.actor import make_policy_fns
from podrace.config import TrainConfig, replace, resolved, validate
from podrace.control import Control, Lifetime, Watchdog, raise_stopped_if_stopping
from podrace.envs import env_spec, resolve_backend
from podrace.evaluate import EvalResult, make_greedy_policy
from podrace.metrics.loggers import Sink, check_sinks, make_sinks
from podrace.metrics.registry import Metrics
from podrace.networks import make_network
from podrace.pipeline import Pipeline, PlacingSink
from podrace.runtime.build import (
    build_actor,
    build_evaluator,
    build_learner,
    dummy_trajectory,
    warm_up_greedy,
    warm_up_learner,
    warm_up_policy,
)
from podrace.runtime.devices import resolve_devices
from podrace.runtime.memory import check_fits
from podrace.runtime.rundir import create_run_dir, remove_run_dir, write_config
from podrace.runtime.threads import ThreadGroup
from podrace.sync.local import LocalPublisher

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


def train(cfg: TrainConfig, lifetime: Lifetime | None = None) -> TrainResult:
    """Train with the single-host thread runtime; raises ConfigError before anything starts."""
    return prepare(cfg, lifetime).run()


def prepare(cfg: TrainConfig, lifetime: Lifetime | None = None) -> "SingleHostRun":
    """Validate, build and compile everything; no thread is started yet.

    `lifetime` lets a caller stop the run from outside (a signal); a stop during
    preparation raises `Stopped` between steps.
    """
    lifetime = lifetime or Lifetime()
    validate(cfg)
    resolve_backend(cfg.env)
    check_sinks(cfg.log)
    devices = resolve_devices(cfg)
    spec = env_spec(cfg.env)
    check_fits(cfg, make_network(cfg.network, spec), spec, devices)
    lifetime.check()
    run_dir = lifetime.run_dir = create_run_dir(cfg)  # last: nothing is written unless every check passed
    try:
        effective = replace(resolved(cfg), **{"log.run_name": run_dir.name})
        write_config(run_dir, effective)
        return SingleHostRun(effective, spec, devices, run_dir, lifetime)
    except BaseException as error:
        remove_run_dir(run_dir)
        raise_stopped_if_stopping(lifetime, error)
        raise


class SingleHostRun:
    """Every component of one run, wired together; `run()` starts the threads."""

    def __init__(self, cfg: TrainConfig, spec, devices, run_dir: Path, lifetime: Lifetime):
        self.cfg, self.run_dir = cfg, run_dir
        self.lifetime = lifetime
        self.metrics = metrics = Metrics()
        self.watchdog = watchdog = Watchdog(lifetime, cfg.safety.watchdog_s)
        self.stuck: list[str] = []
        self.extra_sinks: list[Sink] = []
        """Metrics sinks a caller adds before `run()` (after the configured ones)."""
        network = make_network(cfg.network, spec)
        self.pipeline = pipeline = Pipeline(cfg.num_actors, cfg.layout.queue_size, cfg.max_policy_lag, lifetime)
        self.publisher = publisher = LocalPublisher()
        lifetime.on_stop(publisher.close)
        self.learner, placement = build_learner(
            cfg, spec, network, devices.learners, pipeline, publisher, metrics, lifetime
        )
        self.learner.on_update = self._after_update
        sink = PlacingSink(pipeline, placement.place)
        fns, greedy = make_policy_fns(network.apply), make_greedy_policy(network.apply)

        compile_start = time.perf_counter()
        dummies = {}
        for device in devices.actors:
            lifetime.check()
            warm_up_policy(cfg, spec, fns.on(device), self.learner.state.params)
            dummies[device] = placement.place(dummy_trajectory(cfg, spec, device))
        lifetime.check()
        warm_up_learner(self.learner, [dummies[devices.actors[0]]] * cfg.num_actors)
        lifetime.check()
        warm_up_greedy(cfg, spec, greedy, self.learner.state.params, devices.evaluator)
        self.compile_s = time.perf_counter() - compile_start

        def control(name: str) -> Control:
            return Control(lifetime, watchdog.heartbeat(name), metrics.add_many)

        self.actors = []
        for actor_id in range(cfg.num_actors):
            lifetime.check()
            device = devices.actors[actor_id // cfg.layout.actors_per_device]
            params = publisher.subscribe(device=device, name=f"actor-{actor_id}")
            self.actors.append(build_actor(cfg, actor_id, fns.on(device), params, sink, control(f"actor-{actor_id}")))
        params = publisher.subscribe(device=devices.evaluator, name="evaluator")
        self.evaluator = build_evaluator(cfg, greedy, devices.evaluator, params, metrics, control("evaluator"))

    def _after_update(self, version: int) -> None:
        every = self.cfg.eval.every_updates
        if every and version % every == 0 and version < self.cfg.num_updates:
            self.evaluator.request(version)

    def run(self) -> TrainResult:
        cfg, lifetime, metrics = self.cfg, self.lifetime, self.metrics
        final: list[EvalResult] = []
        learned: list[float] = []

        def learn() -> None:
            self.learner.run()
            learned.append(time.perf_counter() - train_start)
            final.append(self.evaluator.evaluate_final(self.learner.version))
            lifetime.stop("finished")

        sinks: list[Sink] = make_sinks(cfg, self.run_dir)
        sinks.extend(self.extra_sinks)

        group = ThreadGroup(lifetime)
        train_start = time.perf_counter()
        try:
            for actor in self.actors:
                group.spawn(f"actor-{actor.actor_id}", actor.run)
            group.spawn("evaluator", self.evaluator.run)
            group.spawn("learner", learn)
            group.spawn("watchdog", self.watchdog.run, guard_transfers=False)
            self._log_until_stopped(sinks, train_start)
        finally:  # also on KeyboardInterrupt: stop, join, flush, then let it propagate
            lifetime.stop("shutdown")
            self.stuck = stuck = group.join(STOP_GRACE_S)
            train_s = time.perf_counter() - train_start
            self._write_line(sinks, train_start, final=True)
            for sink in sinks:
                self._logging(sink.close)
            for actor in self.actors:
                if f"actor-{actor.actor_id}" not in stuck:
                    actor.env.close()
            if "evaluator" not in stuck:
                self.evaluator.env.close()
            if stuck and lifetime.stop_reason == "finished":
                lifetime.fail("runtime", TimeoutError(f"threads did not stop within {STOP_GRACE_S}s: {stuck}"))
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
        )

    def _logging(self, fn, *args) -> bool:
        """Run one sink call; any exception fails the run as component `logger`."""
        try:
            fn(*args)
            return True
        except Exception as error:  # noqa: BLE001 - becomes the run's failure
            self.lifetime.fail("logger", error)
            return False

    def _write_line(self, sinks: list[Sink], start: float, final: bool = False) -> bool:
        line = self.metrics.collect()
        line.update({f"sync/{k}": v for k, v in self.publisher.metrics().items()})
        elapsed = time.perf_counter() - start
        line["time_s"] = elapsed
        line["sps"] = line.get("env_steps", 0.0) / max(elapsed, 1e-9)
        if final:
            line["final"] = 1
        return all([self._logging(sink.write, line) for sink in sinks])

    def _log_until_stopped(self, sinks: list[Sink], start: float) -> None:
        while not self.lifetime.wait(self.cfg.log.interval_s):
            if not self._write_line(sinks, start):
                return


__all__ = ["STOP_GRACE_S", "SingleHostRun", "TrainResult", "prepare", "train"]
