"""A run's cluster: which processes make the run, how they meet, and how they leave.

One of a topology's two axes (`podrace.runtime.topology`); the other, the fleet
(`podrace.runtime.fleet`), says who steps envs and who chooses actions. A cluster knows
processes, devices and the run directory, and nothing of actors. Three exist:

- `OneProcess` (here): this process is the whole run;
- `RayDriver` (`podrace.runtime.ray.driver`): this process drives a Ray cluster whose
  workers the fleet starts;
- `DistributedGroup` (`podrace.runtime.multihost.group`): N processes of
  jax.distributed, whose learners are one program over the global mesh.

A cluster's life: `check` (before anything starts, the caller's envs too), `join` (meet
the others),
`devices` and the run directory (`lock_resumed`, `claim_run_dir`), `writers` of
checkpoints; once the loops run, `watch` (a lost process fails the run), `explain` (a
failed collective); at the end `last_save_version` (the version every process saves),
`release` (the run's threads have stopped) and `leave` (for good).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from podrace.checkpoints.files import Writers
    from podrace.config import TrainConfig
    from podrace.control import Lifetime
    from podrace.envs.source import EnvSource
    from podrace.rundir import RunLock
    from podrace.runtime.devices import Devices


class Cluster(Protocol):
    """Which processes make a run and how they meet and leave; one instance per run."""

    name: str
    """`one-process`, `ray` or `jax.distributed` (a key of `runtime.topology.TOPOLOGIES`)."""
    process_id: int
    """This process's index in the run (0 unless several processes share it)."""
    num_processes: int
    stop_grace_s: float
    """Seconds every thread gets to return after a stop before it counts as stuck."""
    exit_grace_s: float
    """After a signal, seconds the CLI gives the run to stop before the process exits."""

    def check(self, cfg: TrainConfig, envs: EnvSource | None) -> None:
        """ConfigError for what must hold before anything starts: a missing dependency, a
        caller's envs (`envs`, None: the config's) that this cluster cannot send to the
        processes that build them (a factory that does not pickle)."""

    def join(self, cfg: TrainConfig, lifetime: Lifetime, resuming: bool) -> TrainConfig:
        """Meet the run's other processes or cluster; the config this process runs
        (`resuming`: the config is a checkpoint's, its run directory exists)."""

    def devices(self, cfg: TrainConfig) -> Devices:
        """The actor, learner (the mesh may span processes) and evaluator devices."""

    def lock_resumed(self, run_dir: Path) -> RunLock:
        """Lock this process's part of the resumed run in `run_dir`, once joined."""

    def claim_run_dir(
        self, cfg: TrainConfig, lifetime: Lifetime, resumed: Path | None
    ) -> tuple[Path, Path]:
        """(this process's run directory, the run's root: where checkpoints live), both
        existing: `resumed`'s, or a new one created here (`lifetime.run_dir` then names
        what to discard should the run end before its first update)."""

    def writers(self) -> Writers:
        """Which processes write checkpoints together (and whether they can)."""

    def watch(self, lifetime: Lifetime) -> None:
        """The loops start: from now on a lost process fails `lifetime`."""

    def explain(self, error: BaseException) -> BaseException:
        """The failure to report for a learner update that raised `error` (a failed
        collective: the process that was lost)."""

    def last_save_version(
        self, recorded: int, returned: bool, abandon_write: Callable[[], None]
    ) -> int | None:
        """The version the run saves now that it stopped (None: no last save);
        `recorded`: the newest version this process recorded, `returned`: the learner
        thread returned (else it is stuck). `abandon_write` gives up a write in progress
        (it would wait for a lost process)."""

    def release(self, updates: int) -> None:
        """The run's threads have stopped (`updates`: the learner's version): let go of
        what only the run used; idempotent."""

    def leave(
        self,
        error: BaseException | None = None,
        interrupted: Callable[[], int | None] | None = None,
    ) -> None:
        """Leave the run's other processes for good; idempotent. `error`: preparing or
        running failed with it (tell them, wait for none); else the run returned: wait
        until every process is done (`interrupted()`, the signal received so far, ends the
        wait)."""


class OneProcess:
    """This process is the whole run: nothing to meet, nothing to leave."""

    name = "one-process"
    process_id = 0
    num_processes = 1
    stop_grace_s = 1.0
    exit_grace_s = 1.5

    def check(self, cfg: TrainConfig, envs: EnvSource | None) -> None:
        pass

    def join(self, cfg: TrainConfig, lifetime: Lifetime, resuming: bool) -> TrainConfig:
        return cfg

    def devices(self, cfg: TrainConfig) -> Devices:
        from podrace.runtime.devices import resolve_devices

        return resolve_devices(cfg)

    def lock_resumed(self, run_dir: Path) -> RunLock:
        from podrace.rundir import RunLock

        return RunLock(run_dir)

    def claim_run_dir(
        self, cfg: TrainConfig, lifetime: Lifetime, resumed: Path | None
    ) -> tuple[Path, Path]:
        from podrace.rundir import create_run_dir

        if resumed is not None:
            return resumed, resumed
        run_dir = lifetime.run_dir = create_run_dir(cfg)
        return run_dir, run_dir

    def writers(self) -> Writers:
        from podrace.checkpoints.files import Writers

        return Writers()

    def watch(self, lifetime: Lifetime) -> None:
        pass

    def explain(self, error: BaseException) -> BaseException:
        return error

    def last_save_version(
        self, recorded: int, returned: bool, abandon_write: Callable[[], None]
    ) -> int | None:
        return recorded if returned else None

    def release(self, updates: int) -> None:
        pass

    def leave(
        self,
        error: BaseException | None = None,
        interrupted: Callable[[], int | None] | None = None,
    ) -> None:
        pass


__all__ = ["Cluster", "OneProcess"]
