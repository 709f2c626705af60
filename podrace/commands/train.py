"""`podrace train`: parse the config, then run it through the library's entry
(`podrace.runtime.run.run_to_end`) in a worker thread that `podrace.commands.supervisor`
watches from the main thread; how the run ended becomes one line and an exit code.

The config is parsed before JAX is imported, so that the CLI can force as many CPU devices
as the layout names (appending to, never replacing, the user's XLA_FLAGS).
"""

from __future__ import annotations

import errno
import re
import sys
import threading
import traceback
from collections.abc import Sequence

from podrace.commands import supervisor
from podrace.commands.std_streams import print_error, print_result
from podrace.commands.supervisor import Signals, supervise
from podrace.config import ConfigError, TrainConfig, distributed_requested
from podrace.control import ExplainedError
from podrace.metrics.loggers import SinkError
from podrace.runtime.xla_setup import set_xla_flags
from podrace.wording import counted


def explains_itself(error: BaseException) -> bool:
    """Failures whose one-line message is the whole story (no traceback helps the user)."""
    if isinstance(error, OSError) and error.errno in (
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
    ):
        return True  # the message names the path and what the system refused
    # A full disk under a checkpoint write reaches us as orbax/TensorStore's ValueError.
    if isinstance(error, ExplainedError) or "No space left on device" in str(error):
        return True
    return error.__cause__ is not None and explains_itself(error.__cause__)  # an EnvError of one


def parse_train(args: Sequence[str]) -> TrainConfig:
    import tyro

    from podrace.commands.arguments import parse
    from podrace.presets import cli_presets

    return parse(
        lambda: tyro.extras.overridable_config_cli(
            cli_presets(), prog="podrace train", args=list(args)
        )
    )


def split_resume(args: Sequence[str]) -> tuple[tuple[str, int | None] | None, list[str]]:
    """((RUN_DIR, STEP or None) or None, the other args) from `--resume`/`--resume-from`."""
    found: dict[str, str] = {}
    rest: list[str] = []
    items = iter(args)
    for arg in items:
        name, eq, value = arg.partition("=")
        if name in ("--resume", "--resume-from"):
            if not eq:
                value = next(items, None)
                if value is None or value.startswith("--"):
                    raise ConfigError(f"{name} needs a value")
            if not value.strip():
                raise ConfigError(f"{name} needs a value, got {value!r}")
            if name in found:
                raise ConfigError(f"{name} given twice")
            found[name] = value
        else:
            rest.append(arg)
    if "--resume" not in found:
        if "--resume-from" in found:
            raise ConfigError("--resume-from needs --resume RUN_DIR")
        return None, rest
    step = found.get("--resume-from")
    if step is not None and not (re.fullmatch(r"[0-9]+", step) and int(step) < 2**31):
        raise ConfigError(
            f"--resume-from must be a checkpoint step (a non-negative integer), got {step!r}"
        )
    if rest and not rest[0].startswith("-"):
        raise ConfigError(
            f"--resume continues a run with the config of its checkpoint; drop {rest[0]!r}"
        )
    return (found["--resume"], None if step is None else int(step)), rest


def parse_resumed(run_dir: str, step: int | None, args: Sequence[str]):
    """(Resume pinned to a step, config): the checkpoint's config with the flags in `args`
    applied; ConfigError for a flag --resume does not allow. Starts no JAX backend."""
    from pathlib import Path

    import tyro

    from podrace.checkpoints.resume import Resume, check_changes, run_config_json, stored_config
    from podrace.rundir import RunLock, check_resumable_run_dir

    early = run_config_json(Path(run_dir))
    if early is not None:
        set_xla_flags(early)  # the layout cannot change: its devices, before JAX starts
    resume = Resume(Path(run_dir), step)
    check_resumable_run_dir(resume.run_dir)
    from podrace.runtime.population import is_population

    if early is not None and is_population(early, resume):  # a member alone: ConfigError
        return _parse_population_resumed(resume, early, args)
    if early is None or not distributed_requested(early):  # each process locks its own part
        # A run still writing it is "in use" before its checkpoints are read.
        RunLock(resume.run_dir).release()
    step, stored = stored_config(resume)
    from podrace.commands.arguments import parse

    cfg = parse(
        lambda: tyro.cli(
            TrainConfig, default=stored, args=list(args), prog="podrace train --resume RUN_DIR"
        )
    )
    check_changes(stored, cfg, step)
    return Resume(Path(run_dir), step, step_was_latest=resume.step is None), cfg


def _parse_population_resumed(resume, stored: TrainConfig, args: Sequence[str]):
    """`parse_resumed` for a population's run directory: its config.json with the flags in
    `args` applied (each member resumes from its own latest checkpoint)."""
    import tyro

    from podrace.commands.arguments import parse
    from podrace.rundir import RunLock
    from podrace.runtime.population import check_population_changes

    if resume.step is not None:
        raise ConfigError(
            "--resume-from cannot pick one checkpoint for a population: each member resumes "
            "from its own latest"
        )
    RunLock(resume.run_dir).release()  # "in use" while a population still writes it
    cfg = parse(
        lambda: tyro.cli(
            TrainConfig, default=stored, args=list(args), prog="podrace train --resume RUN_DIR"
        )
    )
    check_population_changes(stored, cfg)
    return resume, cfg


class Training:
    """`podrace train` in a worker thread, so the main thread is always free to see signals.
    The run goes through `podrace.runtime.run.run_to_end`, the entry `podrace.train` calls
    too; this object watches it (a `Watcher`) and turns how it ended into one line and an
    exit code (`_exit_code`)."""

    def __init__(self, args: Sequence[str], signals: Signals):
        self.args, self.signals = args, signals
        signals.before_exit = self.discard_untrained_run_dir
        signals.last_words = self.checkpoint_left
        self.lifetime = None  # the run's Lifetime, once JAX is imported
        self.grace_s = supervisor.EXIT_GRACE_S
        self.starved_exit_s = supervisor.STARVED_EXIT_S
        self.run = None
        self.topology = None
        self.outcome: list = []
        self.distributed = False
        self._stopped_line = threading.Lock()
        self._stopped_line_written = False

    def __call__(self) -> None:
        try:
            self.outcome.append(self._train())
        except BaseException as error:  # noqa: BLE001 - handed to the main thread
            self.outcome.append(error)

    # Watcher (`podrace.runtime.run.Watcher`) ---------------------------------------------
    def chose(self, topology) -> None:
        self.topology = topology
        self.grace_s = topology.cluster.exit_grace_s

    def prepared(self, run) -> None:
        self.run = run

    def _train(self) -> int:
        try:
            result = self._run_to_end()
        except BaseException as error:
            return self._exit_code(error)
        return self._done(result)

    def _run_to_end(self):
        from podrace.envs import silence_env_warnings

        silence_env_warnings()
        resume = None
        resuming, rest = split_resume(self.args)
        if resuming is not None:
            resume, cfg = parse_resumed(*resuming, rest)
        if resume is None:
            cfg = parse_train(self.args)
        from podrace.envs.user_modules import make_working_dir_importable

        make_working_dir_importable(cfg.env.id)
        self.distributed = distributed_requested(cfg)
        self.starved_exit_s = max(supervisor.STARVED_EXIT_S, 2 * cfg.safety.watchdog_s)
        set_xla_flags(cfg)  # before JAX starts its backend
        from podrace.control import Lifetime
        from podrace.runtime.run import run_to_end

        self.lifetime = lifetime = Lifetime()
        if self.signals.received:
            lifetime.stop(f"{self.signals.name} received")
        return run_to_end(cfg, lifetime, lambda: self.signals.received, resume=resume, watcher=self)

    def _exit_code(self, error: BaseException) -> int:
        """How a run that raised `error` ends: one line on stderr and its exit code (a
        ConfigError 2, a failure 1, a stop 128 + the signal); anything else is raised."""
        from podrace.control import ComponentError, Stopped

        if isinstance(error, ConfigError):
            return print_error(str(error))
        if isinstance(error, Stopped) and self.signals.received:
            return self.stopped()
        if isinstance(error, ComponentError):
            from podrace.runtime.multihost.peers import PeerLost, PeerStopped

            if isinstance(error.error, PeerStopped):  # Ctrl-C on another process
                if self.signals.received:  # and on this one: its own line and code
                    return self.stopped()
                print(f"podrace: {error.error}, stopped", file=sys.stderr)
                return 128 + error.error.signum
            if not isinstance(error.error, PeerLost) and not explains_itself(error.error):
                traceback.print_exception(error.error, file=sys.stderr)
            # Notes: what failed after it while the run was shutting down (its last save).
            notes = "".join(f"; {note}" for note in getattr(error, "__notes__", ()))
            print(f"podrace: error: {error}{notes}", file=sys.stderr)
            return 1
        if isinstance(error, SinkError):  # a sink that failed outside the runtime's loop
            print(f"podrace: error: logger failed: {error}", file=sys.stderr)
            return 1
        raise error

    def _done(self, result) -> int:
        """The line of a run that returned; its exit code."""
        if self.signals.received:
            return self.stopped()
        final = result.final_eval
        evaluation = (
            f"final eval return {final.mean_return:.1f}" if final else "no final evaluation"
        )
        skipped = (
            f" ({result.skipped_updates} skipped as non-finite)" if result.skipped_updates else ""
        )
        if self.distributed and final is None:
            evaluation += " (only process 0 evaluates)"
        if result.members:
            best = max(
                range(len(result.members)),
                key=lambda i: getattr(result.members[i].final_eval, "mean_return", float("-inf")),
            )
            evaluation += f" (best of {len(result.members)} members: member-{best})"
        checkpoint = getattr(result, "checkpoint", None)
        saved = f"\ncheckpoint: update {checkpoint}" if checkpoint is not None else ""
        return print_result(
            f"done: {result.env_steps:,} env steps, {counted(result.updates, 'update')}{skipped} "
            f"in {result.train_s:.1f}s (+{result.compile_s:.1f}s compile), {evaluation}"
            f"\nrun directory: {result.run_dir}{saved}"
        )

    def leave_cluster(self) -> None:
        """Leave the run's other processes (jax.distributed) at once, before the process
        exits (nothing when the run left them already)."""
        if self.topology is not None:
            from podrace.control import Stopped

            self.topology.cluster.leave(Stopped("the process exits"))

    def discard_untrained_run_dir(self) -> None:
        """For a process about to exit early: see `discard_if_untrained`."""
        from podrace.rundir import discard_if_untrained

        run_dir = self.lifetime.run_dir if self.lifetime is not None else None
        discard_if_untrained(run_dir, getattr(getattr(self.run, "learner", None), "version", None))

    def checkpoint_left(self) -> str:
        """For the line of a process that exits at once (a second signal): '; ' and which
        checkpoint is the run's latest complete one, and which write it abandons; '' before
        the run is built."""
        checkpoints = getattr(self.run, "checkpoints", None)
        if checkpoints is None:
            return ""
        latest, writing = checkpoints.latest, checkpoints.writing
        words = (
            f"; checkpoint {latest} is the latest complete (podrace train --resume {self.run.root})"
            if latest is not None
            else "; no checkpoint is complete"
        )
        if writing is not None:
            words += f"; checkpoint {writing} was being written and is discarded"
        return words

    def stopped(self, left_behind: bool = False) -> int:
        """Print the line of a run stopped by a signal; its exit code. `left_behind`: the
        process exits while threads still run (the grace period is over)."""
        checkpoints = getattr(self.run, "checkpoints", None)
        latest = checkpoints.latest if checkpoints is not None else None
        saved = (
            f"; checkpoint {latest} saved (podrace train --resume {self.run.root})"
            if latest is not None
            else ""
        )
        writing = checkpoints.writing if checkpoints is not None else None
        if writing is not None:
            kept = (
                f"checkpoint {latest} is the latest"
                if latest is not None
                else "earlier checkpoints are kept"
            )
            line = (
                f"stopped; checkpoint {writing} did not finish writing in time and is "
                f"discarded; {kept}"
            )
        elif left_behind:
            line = f"stopped; threads still busy in native code are left behind{saved}"
        else:
            line = f"stopped cleanly{saved}"
        with self._stopped_line:  # once: the run's thread and the main thread's exit may race
            if not self._stopped_line_written:
                print(f"podrace: {self.signals.name} received, {line}", file=sys.stderr)
                self._stopped_line_written = True
        return 128 + self.signals.received


def train_command(args: Sequence[str]) -> int:
    signals = Signals()
    signals.install()
    try:
        return supervise(Training(args, signals), signals)
    finally:
        signals.restore()
