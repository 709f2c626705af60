"""One run of the learning grid: where it stands, the `podrace train` command that starts or
continues it, and the result JSON made from what the run wrote.

A run's state is read from disk, so the runner can be stopped and started again at any
point: a result JSON means done; a run directory whose metrics reach the last update means
finished (only its JSON is missing); one with a checkpoint is resumed from it; one with
neither (killed before its first checkpoint) is moved aside and the run starts over.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import statistics
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from learning_env import hardware, versions
from learning_suites import REPO, RunSpec

from podrace.config import ConfigError
from podrace.metrics.plot import eval_curve, load_run, return_curve

EVALS_PER_RUN = 25
"""Evaluations the runner asks of every run (`--eval.every-updates`), for the curve."""
CHECKPOINTS_PER_RUN = 20
"""Checkpoints of every run (`--checkpoint.every-updates`): a stop loses at most 5%."""
FINAL_EVALS = 3
FINAL_RETURN_RULE = (
    f"mean of the last {FINAL_EVALS} evaluations (deterministic policy), the final one included"
)
FINAL_TRAIN_SHARE = 0.05
FINAL_TRAIN_RETURN_RULE = (
    "mean of the training-episode returns (stochastic policy) of the metric lines in the "
    f"last {FINAL_TRAIN_SHARE:.0%} of env steps, as the published training-return curves"
)
TRAIN_POINTS = 200
"""Training-return points kept in a result JSON (the curve, evenly thinned)."""


@dataclass(frozen=True)
class Schedule:
    """Evaluation and checkpoint intervals of a run, in learner updates."""

    eval_every: int
    checkpoint_every: int

    @classmethod
    def for_updates(cls, num_updates: int) -> Schedule:
        return cls(max(1, num_updates // EVALS_PER_RUN), max(1, num_updates // CHECKPOINTS_PER_RUN))


def podrace_command() -> list[str]:
    return ["python", "-m", "podrace.cli"]


def train_args(spec: RunSpec, runs: Path, schedule: Schedule, extra: list[str]) -> list[str]:
    """`podrace train` arguments that start the run afresh."""
    return [
        "train",
        spec.preset,
        "--env.id",
        spec.task,
        "--seed",
        str(spec.seed),
        "--total-steps",
        str(spec.suite.total_steps),
        "--eval.every-updates",
        str(schedule.eval_every),
        "--checkpoint.every-updates",
        str(schedule.checkpoint_every),
        "--log.run-dir",
        relative(runs / spec.suite.name),
        "--log.run-name",
        spec.name,
        "--log.console",
        "lines",
        *extra,
    ]


def resume_args(spec: RunSpec, runs: Path) -> list[str]:
    return ["train", "--resume", relative(spec.run_dir(runs)), "--log.console", "lines"]


def checkpoint_steps(run_dir: Path) -> list[int]:
    """Steps of the complete checkpoints of a run (orbax's temp dirs have other names)."""
    directory = run_dir / "checkpoints"
    if not directory.is_dir():
        return []
    return sorted(
        int(p.name) for p in directory.iterdir() if p.is_dir() and re.fullmatch(r"[0-9]+", p.name)
    )


def reached_the_end(run_dir: Path) -> bool:
    """Whether the run's metrics hold its final line at its last update."""
    try:
        run = load_run(run_dir)
    except ConfigError:  # no metrics yet (killed while starting), or no run directory
        return False
    last = run.lines[-1]
    return bool(last.get("final")) and last.get("version", 0) >= run.cfg.num_updates


def state(spec: RunSpec, runs: Path, results: Path) -> str:
    """done | finished | stopped | abandoned | new (see the module docstring)."""
    if spec.result_path(results).is_file():
        return "done"
    run_dir = spec.run_dir(runs)
    if not run_dir.exists():
        return "new"
    if reached_the_end(run_dir):
        return "finished"
    return "stopped" if checkpoint_steps(run_dir) else "abandoned"


def set_aside(spec: RunSpec, runs: Path) -> Path:
    """Move a run directory without a checkpoint, and the record of its launches, out of the
    way (kept, never deleted): the run starts over, its wall time from zero."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    run_dir, segments = spec.run_dir(runs), spec.segments_path(runs)
    target = run_dir.with_name(f"{run_dir.name}.abandoned-{stamp}")
    run_dir.rename(target)
    if segments.is_file():
        segments.rename(target.with_name(f"{target.name}.segments.json"))
    return target


# Segments: one per launch of `podrace train` for the run ---------------------------------


def read_segments(spec: RunSpec, runs: Path) -> list[dict]:
    path = spec.segments_path(runs)
    return json.loads(path.read_text()) if path.is_file() else []


def add_segment(spec: RunSpec, runs: Path, segment: dict) -> None:
    """Append a launch's record; written to a temp file and renamed (never half-written)."""
    path = spec.segments_path(runs)
    segments = read_segments(spec, runs) + [segment]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(segments, indent=1) + "\n")
    os.replace(tmp, path)


# The result --------------------------------------------------------------------------------


def _thin(points: list[list[float]], most: int) -> list[list[float]]:
    if len(points) <= most:
        return points
    step = (len(points) - 1) / (most - 1)
    return [points[round(i * step)] for i in range(most)]


def command_line(args: list[str]) -> str:
    return shlex.join(podrace_command() + args)


def result(spec: RunSpec, runs: Path, runner_command: list[str]) -> dict:
    """The result JSON of a finished run, from its run directory and its segments (the
    first of which started it: its command reproduces the run)."""
    run_dir = spec.run_dir(runs)
    run = load_run(run_dir)
    e_steps, _, e_returns = eval_curve(run)
    t_steps, _, t_returns = return_curve(run)
    last = run.lines[-1]
    segments = read_segments(spec, runs)
    wall_s = sum(s["wall_s"] for s in segments)
    steps = int(last.get("env_steps", 0))
    final = e_returns[-FINAL_EVALS:]
    late = [r for s, r in zip(t_steps, t_returns) if s >= (1 - FINAL_TRAIN_SHARE) * steps]
    return {
        "suite": spec.suite.name,
        "preset": spec.preset,
        "task": spec.task,
        "seed": spec.seed,
        "total_steps": spec.suite.total_steps,
        "budget": spec.suite.budget,
        "steps": steps,
        "updates": int(last.get("version", 0)),
        "final_return": statistics.fmean(final) if final else None,
        "final_return_rule": FINAL_RETURN_RULE,
        "final_train_return": statistics.fmean(late) if late else None,
        "final_train_return_rule": FINAL_TRAIN_RETURN_RULE,
        "eval_episodes": run.cfg.eval.episodes,
        "eval_curve": [[int(s), r] for s, r in zip(e_steps, e_returns)],
        "train_curve": _thin(
            [[int(s), r] for s, r in zip(t_steps, t_returns) if math.isfinite(r)], TRAIN_POINTS
        ),
        "train_curve_rule": "mean return of the training episodes that ended in each metrics "
        "interval (stochastic policy), thinned evenly",
        "wall_s": round(wall_s, 1),
        "train_s": round(float(last.get("time_s", 0.0)), 1),
        "steps_per_s": round(steps / wall_s, 1) if wall_s else None,
        "segments": segments,
        "hardware": hardware(),
        "versions": versions(),
        "command": segments[0]["command"] if segments else None,
        "runner_command": shlex.join(runner_command),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def write_json(path: Path, data: dict) -> None:
    """Write `data` as JSON to a temp file and rename it over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def relative(path: Path) -> str:
    """`path` relative to the repository where it lies inside it: runs start in the
    repository, so their commands stay valid in another checkout."""
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)
