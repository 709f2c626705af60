"""A population (`--pbt.population N`): N members trained side by side in this process, each
a whole run (`podrace.runtime.run.prepare`: its learner, publisher, actor threads, evaluator,
checkpoints and metrics in `RUN/member-<i>/`), their learners meeting in an `Exchange`
(`podrace.runtime.pbt_exchange`) to exploit and explore.

Sharing the machine: every member has the config's actor threads and envs (so each member's
rollouts are what one run's would be), envpool's worker threads are split over all members'
actors (`runtime.build.env_threads`), and all members use the layout's devices; the operating
system shares the cores between their threads. Each member's actors wait for its own learner
(the lag bound); nothing holds members at the same step (each is ranked at the end of its
own intervals against the others' latest scores). `--total-steps` counts each member's own
env steps.

With `--runtime ray` each member's actors are Ray workers instead, over one Ray connection
the population starts or joins and leaves (`podrace.runtime.ray.population`).

`RUN/` holds the population's config.json and lock, the lineage `pbt.jsonl`, and one run
directory per member. Resuming (`podrace train --resume RUN`) resumes every member from its
own latest checkpoint (a member stopped before its first checkpoint starts afresh), trims
the lineage to what those checkpoints carry, and restores the scores from the members'
metric lines.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from podrace.checkpoints.resume import Resume, run_config_json, stored_config
from podrace.config import ConfigError, TrainConfig, leaves, replace, resolved
from podrace.control import ComponentError, Lifetime, Stopped
from podrace.envs import EnvSource, resolve_backend
from podrace.pbt.config import MUTABLE
from podrace.pbt.controller import starting_hyperparameters
from podrace.pbt.lineage import Lineage, keep_until, read_lines
from podrace.pbt.validation import check_info_metric
from podrace.rundir import (
    RunLock,
    check_new_run_dir,
    claim_new_run_dir,
    create_run_dir,
    discard_run_dir,
)
from podrace.runtime.faults import FaultPlan
from podrace.runtime.pbt_exchange import Exchange
from podrace.runtime.population_restarts import MemberRestarts
from podrace.runtime.population_result import PopulationCheckpoints, population_result
from podrace.runtime.result import TrainResult
from podrace.runtime.skeleton import Run
from podrace.validation import check_types, validate

if TYPE_CHECKING:
    from podrace.runtime.ray.population import SharedRay


def is_population(cfg: TrainConfig | None, resume: Resume | None) -> bool:
    """Whether `cfg` (or, resuming, the run in `resume.run_dir`) is a population; a
    ConfigError for one member of a population (it trains only with the others)."""
    if cfg is None and resume is not None:
        cfg = run_config_json(Path(resume.run_dir))
    if cfg is not None and cfg.pbt.population > 1 and cfg.pbt.member is not None:
        where = f"{resume.run_dir} is" if resume is not None else "pbt.member names"
        raise ConfigError(
            f"{where} member {cfg.pbt.member} of a population: resume the population's run "
            "directory (the folder above it), or leave pbt.member out"
        )
    return cfg is not None and cfg.pbt.population > 1


def member_config(cfg: TrainConfig, root: Path, member: int, values: dict[str, float]):
    """Member `member`'s config: seed + member, its run directory `root/member-<i>`, its
    starting hyperparameters `values`, its console quiet but member 0's."""
    changes = {
        "seed": cfg.seed + member,
        "pbt.member": member,
        "log.run_dir": str(root),
        "log.run_name": f"member-{member}",
        **{f"{cfg.algo}.{name}": value for name, value in values.items()},
    }
    if member:
        changes["log.console"] = "none"
    return replace(cfg, **changes)


def starting_values(cfg: TrainConfig, member: int) -> dict[str, float]:
    pbt, algo_cfg = cfg.pbt, getattr(cfg, cfg.algo)
    space = {name: MUTABLE[cfg.algo][name] for name in pbt.mutated(cfg.algo)}
    values = {name: getattr(algo_cfg, name) for name in space}
    return starting_hyperparameters(
        values, space, pbt.perturb_factors, pbt.resample_probability, cfg.seed, member
    )


@dataclass
class Member:
    index: int
    run: Run
    lifetime: Lifetime


class Population:
    """The members of one population, built; `run()` trains them all to the end."""

    def __init__(self, cfg: TrainConfig, root: Path, lifetime: Lifetime, exchange: Exchange):
        self.cfg, self.root, self.lifetime, self.exchange = cfg, root, lifetime, exchange
        self.members: list[Member] = []
        self.finished: list[int] = []
        """Members whose checkpoint already holds every update (a resumed population)."""
        self.lock: RunLock | None = None
        self.fresh = True
        self.ray: SharedRay | None = None
        """The Ray connection every member's workers use (`--runtime ray`), once joined."""
        self.lifetimes: list[Lifetime] = []
        """Every member lifetime made so far (a stop of the population stops them all)."""
        self.restarts: MemberRestarts | None = None
        """How a failed member is built again from its checkpoint (None: it is not)."""
        self.checkpoints = PopulationCheckpoints(lambda: [m.run for m in self.members])

    # What a watcher (the CLI) reads of a run ---------------------------------------------
    @property
    def stuck(self) -> list[str]:
        return [f"member-{m.index} {name}" for m in self.members for name in m.run.stuck]

    @property
    def saving_last(self) -> bool:
        return any(m.run.saving_last for m in self.members)

    @property
    def learner(self):
        """The most advanced member's learner (its version says whether anything trained)."""
        return max((m.run.learner for m in self.members), key=lambda learner: learner.version)

    def _restart(self, member: Member, error: BaseException) -> Member | None:
        """`member`, failed with `error`, built again from its latest checkpoint (None: it
        does not restart; `podrace.runtime.population_restarts`)."""
        if self.restarts is None or self.lifetime.stopping:
            return None
        if not isinstance(error, Exception):  # KeyboardInterrupt, SystemExit: no restart
            return None
        step = self.restarts.checkpoint_to_restart_from(member.index, error)
        if step is None:
            return None
        self.exchange.forget(member.index, step * self.cfg.steps_per_update)
        lifetime = Lifetime()
        self.lifetimes.append(lifetime)
        if self.lifetime.stopping:  # a stop that came meanwhile
            lifetime.stop(self.lifetime.stop_reason or "stopped")
        run = self.restarts.build(member.index, member.run.cfg, step, lifetime)
        replacement = Member(member.index, run, lifetime)
        self.members[self.members.index(member)] = replacement
        self.exchange.attach(member.index, run.learner, run.metrics)
        run.extra_sinks.append(self.exchange.sink(member.index))
        return replacement

    # Building ----------------------------------------------------------------------------
    def add(self, index: int, run: Run, lifetime: Lifetime) -> None:
        self.members.append(Member(index, run, lifetime))
        self.exchange.attach(index, run.learner, run.metrics)
        run.extra_sinks.append(self.exchange.sink(index))

    def abandon(self) -> None:
        """Undo the members built so far (a later one failed to build)."""
        for member in self.members:
            try:
                member.run.close_envs()
                member.run.fleet.close()
            finally:
                if member.run.lock is not None:
                    member.run.lock.release()
        self.release()

    def release(self) -> None:
        """Leave Ray (every member has stopped), then the run directory."""
        if self.ray is not None:
            ray, self.ray = self.ray, None
            ray.leave()
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        if self.fresh and not any(m.run.learner.version for m in self.members):
            discard_run_dir(self.root)

    # Running -----------------------------------------------------------------------------
    def run(self) -> TrainResult:
        results: dict[int, TrainResult] = {}

        def train(member: Member) -> None:
            index, failure = member.index, None
            while member is not None:
                try:
                    results[member.index] = member.run.run()
                    return
                except BaseException as error:  # noqa: BLE001 - restarts it or fails below
                    failure = error
                try:
                    member = self._restart(member, failure)
                except BaseException as error:  # noqa: BLE001 - its rebuild failed
                    member, failure = None, error
            if isinstance(failure, Stopped) and self.lifetime.stopping:
                return  # the population stopped while the member was built again
            if isinstance(failure, ComponentError):
                self.lifetime.fail(f"member-{index} {failure.component}", failure.error)
            else:
                self.lifetime.fail(f"member-{index}", failure)

        threads = [
            threading.Thread(target=train, args=(m,), name=f"member-{m.index}", daemon=True)
            for m in self.members
        ]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            self.lifetime.stop("finished")  # nothing is left running: a no-op after a stop
            self.release()
        if self.lifetime.failure is not None:
            raise self.lifetime.failure
        return population_result(self.root, self.checkpoints.latest, results)


def prepare_population(
    cfg: TrainConfig | None,
    lifetime: Lifetime,
    envs: EnvSource | None,
    resume: Resume | None,
    faults: FaultPlan | None,
    prepare: Callable[..., Run],
    watcher=None,
) -> Population:
    """Validate, claim `RUN/` and build every member (`prepare` builds one run:
    `podrace.runtime.run.prepare`); no thread starts. ConfigError before anything is written
    for a config that cannot be a population."""
    if resume is not None:
        population, cfg, points = _claim_resumed(cfg, resume, lifetime)
    else:
        population, points = _claim_fresh(cfg, envs, lifetime), {}
        cfg = population.cfg

    if len(population.finished) == cfg.pbt.population:
        population.release()
        raise ConfigError(
            f"nothing to resume: every member of {population.root} is at its last update; pass "
            "a larger --total-steps to extend the population"
        )
    lifetimes = population.lifetimes

    def stop_members() -> None:  # a signal or a member's failure stops every member
        for member_lifetime in list(lifetimes):
            member_lifetime.stop(lifetime.stop_reason or "stopped")

    lifetime.on_stop(stop_members)
    try:
        if cfg.runtime == "ray":
            from podrace.runtime.ray.population import SharedRay

            population.ray = SharedRay()
            population.ray.join(cfg, lifetime, population.root)
        for index in range(cfg.pbt.population):
            if index in population.finished:
                continue
            member_lifetime = Lifetime()
            lifetimes.append(member_lifetime)
            if lifetime.stopping:
                member_lifetime.stop(lifetime.stop_reason or "stopped")
            point = points.get(index)
            if point is not None:
                member_cfg, member_resume = point
            else:
                member_cfg = member_config(cfg, population.root, index, starting_values(cfg, index))
                member_resume = None
            run = prepare(
                member_cfg,
                member_lifetime,
                envs,
                member_resume,
                topology=population.ray.topology() if population.ray is not None else None,
                faults=faults,
                watcher=watcher if index == 0 else None,
            )
            population.add(index, run, member_lifetime)
    except BaseException:
        population.abandon()
        raise

    def rebuild(member_cfg: TrainConfig, member_resume: Resume, member_lifetime: Lifetime) -> Run:
        topology = population.ray.topology() if population.ray is not None else None
        return prepare(
            member_cfg, member_lifetime, envs, member_resume, topology=topology, faults=faults
        )

    population.restarts = MemberRestarts(population.root, rebuild)
    for index in range(cfg.pbt.population):  # scores as the members' kept lines hold them
        for line in _metric_lines(population.root / f"member-{index}"):
            population.exchange.observe(index, line)
    return population


def _claim_fresh(cfg: TrainConfig, envs: EnvSource | None, lifetime: Lifetime) -> Population:
    check_types(cfg)
    validate(cfg)
    cfg = resolved(cfg)
    for index in range(cfg.pbt.population):  # every member's config, before anything is written
        validate(member_config(cfg, Path("."), index, starting_values(cfg, index)))
    backend = resolve_backend(cfg.env) if envs is None or envs.factory is None else None
    check_info_metric(cfg, backend)
    if cfg.runtime == "ray":  # a missing Ray, an env factory that does not pickle
        from podrace.runtime.ray.population import SharedRay

        SharedRay().check(cfg, envs)
    check_new_run_dir(cfg)
    root = lifetime.run_dir = create_run_dir(cfg)
    cfg = replace(cfg, **{"log.run_name": root.name})
    population = Population(cfg, root, lifetime, Exchange(cfg, Lineage(root)))
    population.lock = claim_new_run_dir(root, cfg)
    return population


def _claim_resumed(cfg: TrainConfig | None, resume: Resume, lifetime: Lifetime):
    """(the population, its config, {member: (config, Resume)} of the members that continue
    from a checkpoint); the lineage trimmed to what those checkpoints carry."""
    root = Path(resume.run_dir)
    if resume.step is not None and not resume.step_was_latest:
        raise ConfigError(
            "--resume-from cannot pick one checkpoint for a population: each member resumes "
            "from its own latest"
        )
    lock = RunLock(root)
    try:
        stored = run_config_json(root)
        if stored is None:
            raise ConfigError(f"cannot resume {root}: its config.json cannot be read")
        where = {"log.run_dir": str(root.absolute().parent), "log.run_name": root.absolute().name}
        stored = replace(stored, **where)
        if cfg is not None:
            check_types(cfg)
        cfg = stored if cfg is None else replace(cfg, **where)
        changes = check_population_changes(stored, cfg)
        validate(cfg)
        population = Population(cfg, root, lifetime, Exchange(cfg, Lineage(root)))
        population.fresh = False
        population.lock = lock
        points, steps = {}, {}
        for index in range(cfg.pbt.population):
            member_dir = root / f"member-{index}"
            if not (member_dir / "checkpoints").is_dir():
                discard_run_dir(member_dir)  # stopped before its first checkpoint: afresh
                continue
            member_resume = Resume(member_dir)
            step, member_stored = stored_config(member_resume)
            steps[index] = step * member_stored.steps_per_update
            member_cfg = replace(member_stored, **changes)
            if step >= member_cfg.num_updates:
                population.finished.append(index)
                continue
            points[index] = (member_cfg, Resume(member_dir, step, step_was_latest=True))
        keep_until(root, steps)
        for line in read_lines(root):
            population.exchange.exploited_at[line["member"]] = line["version"]
        if changes:
            from podrace.rundir import write_config

            write_config(root, cfg)
        return population, cfg, points
    except BaseException:
        lock.release()
        raise


def check_population_changes(stored: TrainConfig, cfg: TrainConfig) -> dict[str, object]:
    """The fields `cfg` changes from the population's `stored` config (dotted names); a
    ConfigError for one a resume may not change (`podrace.checkpoints.resume.RESUMABLE`)."""
    from podrace.checkpoints.resume import RESUMABLE

    old = {name: value for name, value, _ in leaves(stored)}
    changes = {}
    for name, value, _ in leaves(cfg):
        if value == old[name]:
            continue
        if not any(name == a or (a.endswith(".") and name.startswith(a)) for a in RESUMABLE):
            raise ConfigError(
                f"--resume cannot change {name} of a population "
                f"(it has {old[name]!r}, got {value!r})"
            )
        changes[name] = value
    return changes


def _metric_lines(run_dir: Path) -> list[dict]:
    from podrace import json_text
    from podrace.checkpoints.resume import read_metric_lines

    lines = []
    for text in read_metric_lines(run_dir) if run_dir.is_dir() else []:
        try:
            lines.append(json_text.loads(text))
        except ValueError:
            continue
    return lines


__all__ = ["Population", "is_population", "member_config", "prepare_population"]
