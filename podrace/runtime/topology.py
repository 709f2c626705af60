"""What a topology supplies to the one run skeleton (`podrace.runtime.run`): where things run.

The skeleton validates, claims the run directory, builds and restores the learner, the
evaluator and the checkpoints, runs the loops and stops them; a topology only says

- how this process joins the others (`join`, `shutdown`): nothing for threads, a Ray
  cluster, jax.distributed;
- which devices the learner mesh spans and which part of the run directory is this
  process's (`devices`, `claim_run_dir`);
- how params reach its actors and how rollouts arrive (`publisher`, `pipeline`,
  `learner_dummies`);
- how its actors are built, started, restarted and stopped (`launch_actors`,
  `actors_ready`, `loops`, `stopping`, `close`), and what of them a checkpoint keeps
  (`actors_saved`).

Each hook gets the `Run` being built, so a topology holds only what is its own (Ray
workers, the peer link). The thread topology (`runtime.threads`) is the reference; the Ray
topology (`runtime.ray`) runs the same actor loop in Ray workers; the multi-host topology
(`runtime.multihost`) is the thread topology in each of several processes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podrace.checkpoints.files import Writers

if TYPE_CHECKING:
    from podrace.checkpoints.resume import ResumePoint
    from podrace.checkpoints.state import RunState
    from podrace.config import TrainConfig
    from podrace.control import Lifetime
    from podrace.envs.source import EnvSource
    from podrace.pipeline import Pipeline
    from podrace.rundir import RunLock
    from podrace.runtime.devices import Devices
    from podrace.runtime.run import Run
    from podrace.sync.base import Publisher
    from podrace.types import Trajectory


class Topology:
    """Where a run's pieces run. Every hook has the single-process default; a topology
    overrides what differs. One instance serves one run."""

    name = "threads"
    stop_grace_s = 1.0
    """Seconds every thread gets to return after a stop before it counts as stuck."""
    exit_grace_s = 1.5
    """After a signal, seconds the CLI gives the run to stop before the process exits."""
    process_id = 0
    """This process's index in the run (0 unless several processes share it)."""
    num_processes = 1

    @property
    def evaluates(self) -> bool:
        """Whether this process runs the evaluator (one process of a run does)."""
        return self.process_id == 0

    # Preparing ---------------------------------------------------------------------------
    def check(self, cfg: TrainConfig) -> None:
        """What must hold before anything starts (a missing dependency): ConfigError."""

    def check_envs(self, envs: EnvSource) -> None:
        """What must hold of a caller's envs before anything starts (a factory this
        topology sends to other processes must pickle): ConfigError."""

    def join(self, cfg: TrainConfig, lifetime: Lifetime, resuming: bool) -> TrainConfig:
        """Join the run's other processes or cluster; returns the config this process runs
        (`resuming`: the config is a checkpoint's, its run directory exists)."""
        return cfg

    def devices(self, cfg: TrainConfig) -> Devices:
        from podrace.runtime.devices import resolve_devices

        return resolve_devices(cfg)

    def lock_resumed(self, point: ResumePoint) -> RunLock:
        """The lock of this process's part of a resumed run, once it has joined (a
        single-process run locks the run before it reads the checkpoint)."""
        from podrace.rundir import RunLock

        return RunLock(point.run_dir)

    def claim_run_dir(
        self, cfg: TrainConfig, lifetime: Lifetime, point: ResumePoint | None
    ) -> tuple[Path, Path]:
        """(this process's run directory, the run's root: where checkpoints live), both
        existing; a fresh run's is created here (`lifetime.run_dir` names what to remove
        should the run be abandoned before its first update)."""
        from podrace.rundir import create_run_dir

        if point is not None:
            return point.run_dir, point.run_dir
        run_dir = lifetime.run_dir = create_run_dir(cfg)
        return run_dir, run_dir

    def publisher(self, run: Run, first_version: int) -> Publisher:
        """Where the learner publishes params for this topology's actors."""
        raise NotImplementedError

    def published(self, params: Any) -> Any:
        """`params` as a subscriber of `publisher` receives them (to compile on)."""
        return params

    def pipeline(self, run: Run, first_seq: int) -> Pipeline:
        from podrace.pipeline import Pipeline

        cfg = run.cfg
        return Pipeline(
            cfg.num_actors, cfg.layout.queue_size, cfg.max_policy_lag, run.lifetime, first_seq
        )

    def learner_dummies(self, run: Run) -> list[Trajectory]:
        """One placed dummy rollout per actor, shaped and sharded as that actor's arrive."""
        raise NotImplementedError

    def launch_actors(self, run: Run) -> None:
        """Start building the actors (they may compile while the learner does)."""

    def actors_ready(self, run: Run) -> None:
        """Return once every actor is built and compiled, ready to start."""
        raise NotImplementedError

    def saved_actors(self, run: Run) -> int:
        """How many actors a checkpoint keeps (every process's)."""
        raise NotImplementedError

    def actors_start(self, run: Run, restored: RunState | None) -> Mapping[str, Any]:
        """Where the actors start: fresh, or from `restored` (ConfigError when this
        topology cannot continue from it); returns `actors_saved` at the start version."""
        raise NotImplementedError

    def actors_saved(self, run: Run, version: int) -> Mapping[str, Any]:
        """What a checkpoint at `version` keeps of the actors: `actor_keys` (the raw key each
        actor started this run with), `actor_next_seq` and `actor_restarts`."""
        raise NotImplementedError

    def writer(self) -> Writers:
        """Which processes write checkpoints together (and whether they can)."""
        return Writers()

    def abandon(self, error: BaseException) -> None:
        """The run's preparation failed with `error`: undo what `join` did."""
        self.close()

    # Running ---------------------------------------------------------------------------
    def starting(self, run: Run) -> None:
        """The loops are about to start."""

    def loops(self, run: Run) -> list[tuple[str, Callable[[], None]]]:
        """The (name, function) of every thread that delivers rollouts into the pipeline."""
        raise NotImplementedError

    def explain(self, error: BaseException) -> BaseException:
        """The failure to report for a learner update that raised `error` (a failed
        collective: the process that was lost)."""
        return error

    def line_extras(self, run: Run) -> dict[str, float]:
        """Values this topology adds to every metrics line."""
        return {}

    def stopping(self, run: Run) -> None:
        """The run is stopping: wake what waits on actors this process does not own."""

    def final_version(self, run: Run, returned: bool) -> int | None:
        """The version to save now that the run stopped (None: no last save); `returned`:
        the learner thread has returned (else it is stuck, its last record stands)."""
        return run.checkpoints.point.version if returned else None

    def env_owners(self, run: Run) -> list[tuple[str, Any]]:
        """(thread name, env) of every env this process owns, for closing them."""
        return []

    def report(self, run: Run) -> Any:
        """What the topology adds to the TrainResult (None: nothing)."""
        return None

    def close(self) -> None:
        """Release what the topology holds (workers, cluster connections); idempotent."""

    # After the run ---------------------------------------------------------------------
    def leave(self, interrupted: Callable[[], int | None]) -> None:
        """After a run that returned: wait until the run's other processes are done too."""

    def shutdown(self, ok: bool) -> None:
        """Leave the run's other processes for good (the process exits next)."""


__all__ = ["Topology"]
