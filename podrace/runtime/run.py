"""One run, every topology: the one entry (`train`, `run_to_end`) that `podrace.train` and
`podrace train` both call, and `prepare`, which builds a run.

`prepare` does everything that can fail because of the request before any thread starts:

1. check the config (and, resuming, the checkpoint and the changes asked for); choose the
   topology (`podrace.runtime.topology`: one cluster x one fleet);
2. the cluster joins its processes (Ray, jax.distributed), which may resolve the config;
3. check the envs' spaces, the metrics sinks, the devices and the memory needed;
4. claim the run directory: create it and write config.json (a fresh run) or take the
   checkpoint's run back (a resume); either way hold its lock;
5. build the run (`podrace.runtime.skeleton.Run`): the learner (restored from the
   checkpoint when resuming), its publisher and the pipeline, compiling the update while
   the fleet builds and starts its actors; the evaluator; a resume then makes the run
   directory the resumed run's.

`run_to_end` then runs it (`Run.run`) and leaves the cluster (`Cluster.leave`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from podrace.checkpoints.resume import Resume, commit, resume_point, resumed_envs
from podrace.config import ConfigError, TrainConfig, distributed_requested, replace, resolved
from podrace.control import Lifetime, raise_stopped_if_stopping
from podrace.envs import EnvSource, env_warnings_silenced, resolve_backend
from podrace.metrics.loggers import check_sinks
from podrace.networks import make_network
from podrace.rundir import RunLock, check_new_run_dir, claim_new_run_dir, discard_run_dir
from podrace.runtime.faults import FaultPlan
from podrace.runtime.interrupts import interrupts_stop
from podrace.runtime.memory import check_fits
from podrace.runtime.population import Population, is_population, prepare_population
from podrace.runtime.result import TrainResult
from podrace.runtime.skeleton import Run
from podrace.runtime.topology import Topology, topology_for
from podrace.runtime.xla_setup import deterministic_gpu_ops
from podrace.sync.versions import finish_releases
from podrace.validation import check_types, validate


class Watcher(Protocol):
    """A caller that watches a run from another thread (the CLI's main thread): what the
    entry tells it as the run gets going."""

    def chose(self, topology: Topology) -> None:
        """The run's topology, before the cluster joins (how long a stop may take)."""

    def prepared(self, run: Run | Population) -> None:
        """The run (or the population of runs), built, before its threads start."""


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
    watcher: Watcher | None = None,
) -> TrainResult:
    """`train` for a caller that watches signals itself (`interrupted()`: the signal
    received so far) and, from another thread, the run (`watcher`)."""
    with env_warnings_silenced():  # as the CLI does
        try:
            if is_population(cfg, resume):
                population = prepare_population(
                    cfg, lifetime, envs, resume, faults, prepare, watcher
                )
                if watcher is not None:
                    watcher.prepared(population)
                return population.run()
            run = prepare(cfg, lifetime, envs, resume, faults=faults, watcher=watcher)
            if watcher is not None:
                watcher.prepared(run)
            cluster = run.cluster
            try:
                result = run.run()
            except BaseException as error:
                cluster.leave(error)
                raise
            cluster.leave(interrupted=interrupted)  # waits until every process is done
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
    watcher: Watcher | None = None,
) -> Run:
    """Validate, join, claim the run directory, build and compile everything; no thread
    is started yet (`Run.run` does).

    `lifetime` lets a caller stop the run from outside (a signal); a stop during
    preparation raises `Stopped` between steps. `envs` is where actors and the evaluator
    get their envs (a user's env factory); by default `cfg.env.id` through its backend.
    With `resume`, the run continues the one in `resume.run_dir` from a checkpoint; `cfg`
    is then None (the checkpoint's config) or that config with the changes
    `podrace.checkpoints.resume.RESUMABLE` allows. `topology` defaults to the one the
    config asks for; `faults` injects failures for tests and drills; `watcher` is told the
    topology once chosen.
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
        if watcher is not None:
            watcher.chose(topology)
        cluster, fleet = topology.cluster, topology.fleet
        cluster.check(cfg, envs)  # a missing Ray is a one-line error
        if point is None and not distributed_requested(cfg):  # before Ray starts, say
            if envs is None or envs.factory is None:
                resolve_backend(cfg.env)
            check_new_run_dir(cfg)  # every process of a group checks it, together (`join`)
    except BaseException as error:
        if lock is not None:
            lock.release()
        if isinstance(error, ConfigError) and cfg is not None and distributed_requested(cfg):
            from podrace.runtime.multihost.distributed import refuse_to_join

            refuse_to_join(cfg.distributed, str(error))  # the others wait for this one
        raise
    run_dir = None
    try:
        cfg = cluster.join(cfg, lifetime, resuming=point is not None)
        envs = resumed_envs(point, envs) if point is not None else envs or EnvSource(cfg.env)
        spec = envs.spec()  # the backend (or the factory) is checked first
        check_sinks(cfg.log)
        if cfg.deterministic:  # the CLI has set it; a library caller may not have
            deterministic_gpu_ops()
        devices = cluster.devices(cfg)
        check_fits(cfg, make_network(cfg.network, spec), spec, devices)
        lifetime.check()
        if lock is None and point is not None:
            lock = cluster.lock_resumed(point.run_dir)
        run_dir, root = cluster.claim_run_dir(
            cfg, lifetime, Path(point.run_dir) if point is not None else None
        )
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
        try:
            fleet.close()
        finally:
            cluster.leave(error)
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


__all__ = [
    "Run",
    "TrainResult",
    "prepare",
    "run_to_end",
    "train",
]
