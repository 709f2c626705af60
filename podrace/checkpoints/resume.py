"""Continuing a stopped run from one of its checkpoints (`podrace train --resume RUN_DIR`).

A resumed run is the same run, not a new one: same directory, the config stored with the
checkpoint, versions, sequence numbers, counters and the learning-rate schedule continuing
where the checkpoint left them. What cannot be saved (envpool env state, actors' queued
rollouts) restarts: every actor's envs are reset with seeds that fold in the resume version
and its key is the saved one folded with that version, so a resumed run differs from a
fresh one deterministically rather than replaying its first rollouts.

Everything here that can fail because of the user's request (not a run directory, no or a
corrupt checkpoint, a flag that would change what the checkpoint holds) raises ConfigError
before anything is written. Only once the run is fully built does `commit` touch the run
directory: metric lines written after the checkpoint (the part of the old run that is being
redone) move from metrics.jsonl to metrics-superseded.jsonl, so the file's env steps and
times never go backwards, and config.json is replaced by the config the run now uses.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from podrace import json_text
from podrace.checkpoints.state import checkpoint_dir
from podrace.config import ConfigError, TrainConfig, leaves, replace
from podrace.rundir import check_resumable_run_dir

if TYPE_CHECKING:
    from podrace.envs import EnvSource

RESUMABLE = (
    "total_steps",
    "checkpoint.",
    "eval.",
    "safety.",
    "inference.",
    "env.worker_restarts",
    "log.console",
    "log.interval_s",
    "log.tensorboard",
    "log.wandb",
    "log.wandb_project",
    # Where the run's workers and processes are found, and how long they may take:
    "ray.address",
    "ray.max_restarts",
    "ray.start_timeout_s",
    "ray.worker_resources",
    "ray.max_workers",
    "ray.no_workers_timeout_s",
    "ray.node_relay",
    "ray.log_to_console",
    "distributed.coordinator",
    "distributed.process_id",
    "distributed.init_timeout_s",
    "distributed.peer_timeout_s",
)
"""Fields a resumed run may change (a name ending in '.' allows its whole section). They
change neither the arrays in a checkpoint nor the data the learner sees; everything else
(network, env, algorithm, layout, seed, the number of Ray workers and of processes) is the
checkpoint's."""

SUPERSEDED = "metrics-superseded.jsonl"
"""Where metric lines written after the resumed checkpoint go (kept, never deleted)."""


@dataclass(frozen=True)
class Resume:
    """Continue the run in `run_dir` from checkpoint `step` (None: the latest)."""

    run_dir: Path
    step: int | None = None
    step_was_latest: bool = False
    """`step` was the latest checkpoint when the config was read (a CLI pins it): another
    latest now means another podrace process wrote the run in between."""


@dataclass(frozen=True)
class ResumePoint:
    """A checked resume request: the checkpoint to load and the config to run with."""

    run_dir: Path
    step: int
    stored: TrainConfig
    """The config saved with the checkpoint (pointing at `run_dir`)."""
    cfg: TrainConfig
    """What the resumed run uses: `stored` plus the allowed changes."""
    env_factory: dict | None = None
    """The env factory the run recorded (`podrace.envs.source.factory_record`); None: its
    envs come from the config's env id."""


def _checkpoints(run_dir: Path) -> Path:
    return checkpoint_dir(run_dir)


def run_config_json(run_dir: Path) -> TrainConfig | None:
    """The run's config.json (None when unreadable), read without JAX: what a CLI needs to
    set XLA flags before the checkpoint is opened. The layout in it is the checkpoint's, as
    a resume cannot change the layout."""
    from podrace.config_dict import config_from_dict

    try:
        return config_from_dict(json_text.loads((Path(run_dir) / "config.json").read_text()))
    except (OSError, ValueError, TypeError):  # ConfigError is a ValueError
        return None


def stored_config(resume: Resume) -> tuple[int, TrainConfig]:
    """(step, the checkpoint's config with log.run_dir/run_name pointing at `resume.run_dir`).

    Verifies the checkpoint's files (a damaged one is a ConfigError naming the file). Starts
    no JAX backend: a multi-host process reads it before it joins the others.
    """
    step, cfg, _ = stored_run(resume)
    return step, cfg


def stored_run(resume: Resume) -> tuple[int, TrainConfig, dict | None]:
    """`stored_config` and the env factory the checkpoint recorded (None: none)."""
    from podrace.checkpoints.read import read_run
    from podrace.checkpoints.steps import checkpoint_steps, leftovers, step_lock

    run_dir = Path(resume.run_dir)
    check_resumable_run_dir(run_dir)
    leftovers(_checkpoints(run_dir))  # a name in the way of the resumed run's writes: refused now
    steps = checkpoint_steps(_checkpoints(run_dir))
    if resume.step_was_latest and steps[-1:] != [resume.step]:
        raise ConfigError(
            f"cannot resume {run_dir}: its checkpoints changed while this command started "
            f"(checkpoint {resume.step} was the latest, now {steps[-1] if steps else 'none'} "
            "is: another podrace process wrote it); run the command again"
        )
    if not steps and _checkpoints(run_dir).exists() and not _checkpoints(run_dir).is_dir():
        raise ConfigError(f"cannot resume {run_dir}: {_checkpoints(run_dir)} is not a directory")
    if not steps:
        raise ConfigError(
            f"cannot resume {run_dir}: it has no checkpoint "
            f"(none was saved in {_checkpoints(run_dir)})"
        )
    if resume.step is not None and resume.step not in steps:
        raise ConfigError(
            f"cannot resume {run_dir} from step {resume.step}: "
            f"saved steps are {', '.join(map(str, steps))}"
        )
    later = [s for s in steps if resume.step is not None and s > resume.step]
    if later:
        raise ConfigError(
            f"cannot resume {run_dir} from step {resume.step}: "
            f"checkpoint(s) {', '.join(map(str, later))} come after it "
            f"and would be replaced; move them out of {_checkpoints(run_dir)} first"
        )
    chosen = steps[-1] if resume.step is None else resume.step
    with step_lock(
        _checkpoints(run_dir) / str(chosen), shared=True
    ):  # a live run's rotation spares it
        step, cfg, env_factory = read_run(_checkpoints(run_dir), chosen)
    here = {"log.run_dir": str(run_dir.absolute().parent), "log.run_name": run_dir.absolute().name}
    return step, replace(cfg, **here), env_factory


def check_changes(stored: TrainConfig, cfg: TrainConfig, step: int) -> None:
    """ConfigError for a change `--resume` does not allow, or a run with nothing left to do."""
    old = {name: value for name, value, _ in leaves(stored)}
    for name, value, _ in leaves(cfg):
        if value != old[name] and not any(
            name == a or (a.endswith(".") and name.startswith(a)) for a in RESUMABLE
        ):
            allowed = ", ".join(a + "*" if a.endswith(".") else a for a in RESUMABLE)
            raise ConfigError(
                f"--resume cannot change {name} "
                f"(the checkpoint's run has {old[name]!r}, got {value!r}); "
                f"a resumed run may change only {allowed}"
            )
    if cfg.num_updates <= step:
        raise ConfigError(
            f"nothing to resume: checkpoint {step} is already at update {step} of "
            f"{cfg.num_updates} (total_steps {cfg.total_steps:,}); pass a larger --total-steps "
            "to extend the run"
        )


def resume_point(resume: Resume, cfg: TrainConfig | None = None) -> ResumePoint:
    """Check a resume request; `cfg` (default: the stored config) may change RESUMABLE fields.
    Where the run lives is `resume.run_dir`, whatever `cfg.log` says (e.g. the run name
    None of the config a fresh run was started with)."""
    step, stored, env_factory = stored_run(resume)
    where = {"log.run_dir": stored.log.run_dir, "log.run_name": stored.log.run_name}
    cfg = stored if cfg is None else replace(cfg, **where)
    check_changes(stored, cfg, step)
    return ResumePoint(Path(resume.run_dir), step, stored, cfg, env_factory)


def resumed_envs(point: ResumePoint, given: EnvSource | None) -> EnvSource:
    """Where the resumed run's envs come from: `given` (a Python caller's), else the env
    factory the run recorded, imported, else the config's env id. A run whose recorded
    factory cannot be imported is refused (its config's env id was never its env), with
    the way to continue it."""
    from podrace.envs.source import FactoryNotImportable, stored_env_source

    try:
        return stored_env_source(point.cfg.env, point.env_factory, given)
    except FactoryNotImportable as error:
        raise ConfigError(
            f"cannot resume {point.run_dir}: {error}; continue the run from Python with the same "
            "factory: podrace.runtime.run.train(None, envs=podrace.envs.EnvSource("
            f"cfg.env, factory), resume=podrace.checkpoints.resume.Resume({str(point.run_dir)!r}))"
        ) from None


# Metrics -------------------------------------------------------------------------------


def split_metrics(lines: list[str], version: int, env_steps: float) -> tuple[list[str], list[str]]:
    """(kept, superseded): the longest prefix of whole lines written up to the checkpoint.

    A line belongs to the checkpoint's past when its `version` and `env_steps` are not
    beyond the checkpoint's; the first line that is (or that is not valid JSON: a line cut
    by a kill) ends the prefix, so the kept lines are exactly what the resumed run extends.
    """
    for number, text in enumerate(lines):
        try:
            line = json_text.loads(text)
            past = line.get("version", 0) <= version and line.get("env_steps", 0) <= env_steps
        except (ValueError, AttributeError, TypeError):
            past = False
        if not past:
            return lines[:number], lines[number:]
    return lines, []


def last_time_s(lines: list[str]) -> float:
    """`time_s` of the last kept line (0 when none): the resumed clock never goes back."""
    for text in reversed(lines):
        value = json_text.loads(text).get("time_s")
        if isinstance(value, (int, float)):
            return float(value)
    return 0.0


def read_metric_lines(run_dir: Path) -> list[str]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    try:
        return path.read_bytes().decode("utf-8", errors="replace").splitlines()
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror}") from None


def commit(
    point: ResumePoint, version: int, env_steps: float, effective: TrainConfig, run_dir: Path
) -> float:
    """Make `run_dir` (this process's part of the run: the run directory, or a process's
    folder in it) the resumed run's: trim metrics.jsonl, rewrite config.json; returns the
    `time_s` of the last kept line.

    Idempotent (resuming the same checkpoint twice trims nothing more), and each file is
    replaced atomically; superseded lines are appended to SUPERSEDED first, so a kill in
    between loses nothing (at worst a line is in both files).
    """
    run_dir = Path(run_dir)
    kept, superseded = split_metrics(read_metric_lines(run_dir), version, env_steps)
    try:
        if superseded:
            with open(run_dir / SUPERSEDED, "a", encoding="utf-8") as f:
                f.write("".join(text + "\n" for text in superseded))
            _replace_text(run_dir / "metrics.jsonl", "".join(text + "\n" for text in kept))
        _replace_text(
            run_dir / "config.json", json.dumps(dataclasses.asdict(effective), indent=2) + "\n"
        )
    except OSError as error:
        raise ConfigError(
            f"cannot update {run_dir} for the resumed run: {error.strerror}"
        ) from None
    return last_time_s(kept)


def _replace_text(path: Path, text: str) -> None:
    """Replace `path` atomically (temp file, rename); when that fails (a full disk) the temp
    file is removed and `path` is as it was."""
    tmp = path.with_name(f".{path.name}.resume-tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


__all__ = [
    "RESUMABLE",
    "SUPERSEDED",
    "Resume",
    "ResumePoint",
    "check_changes",
    "commit",
    "resume_point",
    "resumed_envs",
    "split_metrics",
    "run_config_json",
    "stored_config",
    "stored_run",
]
