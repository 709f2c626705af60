"""`podrace plot RUN` for a population's run directory: every member's ranking metric over
its own env steps, each exploit marked where it happened (from `pbt.jsonl`), and one panel
per hyperparameter the population changes (the `learner/hp/<name>` of the members' metric
lines): the schedules PBT found."""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.figure import Figure

from podrace import json_text
from podrace.config import ConfigError, TrainConfig
from podrace.config_dict import config_from_dict
from podrace.metrics.plot import DPI, load_run
from podrace.pbt.lineage import read_lines


def population_config(run_dir: Path) -> TrainConfig | None:
    """The config of the population in `run_dir`; None when `run_dir` holds no population
    (one run, or something that is not a run directory: `load_run` says what)."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        return None
    try:
        cfg = config_from_dict(json_text.loads(path.read_text(encoding="utf-8")), where=str(path))
    except (OSError, ValueError):
        return None  # load_run names the problem
    return cfg if cfg.pbt.population > 1 and cfg.pbt.member is None else None


def plot_population(run_dir: Path, cfg: TrainConfig) -> Figure:
    """The figure of the population `cfg` in `run_dir`."""
    members = []
    for index in range(cfg.pbt.population):
        member_dir = Path(run_dir) / f"member-{index}"
        if (member_dir / "metrics.jsonl").is_file():
            members.append((index, load_run(member_dir)))
    if not members:
        raise ConfigError(f"{run_dir} is a population whose members have no metric lines yet")
    names = list(cfg.pbt.mutated(cfg.algo))
    metric = cfg.pbt.metric
    lineage = read_lines(run_dir)
    fig = Figure(figsize=(12.0, 4.0 + 2.2 * len(names)), dpi=DPI, layout="constrained")
    grid = fig.add_gridspec(1 + len(names), 1, height_ratios=[2.0] + [1.0] * len(names))
    ax = fig.add_subplot(grid[0])
    fig.suptitle(
        f"{Path(run_dir).absolute().name}: population of {cfg.pbt.population} "
        f"({cfg.env.id}, {cfg.algo}), {len(lineage)} exploits",
        fontsize=13,
    )
    for index, run in members:
        color = f"C{index % 10}"
        xs, ys = _series(run.lines, metric)
        ax.plot(xs, ys, color=color, label=f"member-{index}")
        for line in (x for x in lineage if x.get("member") == index):
            step = line["member_step"]
            y = _value_at(xs, ys, step)
            if y is not None:
                ax.plot([step], [y], marker="v", color=color, markersize=7)
                ax.annotate(
                    f"←{line['copied']}", (step, y), fontsize=7, color=color,
                    textcoords="offset points", xytext=(3, 4),
                )  # fmt: skip
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} by each member's env steps (▼ copied member k: ←k)", fontsize=10)
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    for row, name in enumerate(names, 1):
        hp_ax = fig.add_subplot(grid[row], sharex=ax)
        for index, run in members:
            xs, ys = _series(run.lines, f"learner/hp/{name}")
            hp_ax.plot(xs, ys, color=f"C{index % 10}", drawstyle="steps-post")
        hp_ax.set_ylabel(name, fontsize=9)
        if name == "learning_rate":
            hp_ax.set_yscale("log")
        hp_ax.grid(alpha=0.3)
    fig.axes[-1].set_xlabel("env steps (each member's own)")
    return fig


def _series(lines: list[dict], metric: str) -> tuple[list[float], list[float]]:
    points = [
        (line.get("env_steps", 0.0), line[metric])
        for line in lines
        if isinstance(line.get(metric), (int, float)) and math.isfinite(line[metric])
    ]
    return [p[0] for p in points], [p[1] for p in points]


def _value_at(xs: list[float], ys: list[float], step: float) -> float | None:
    """The last value at or before `step` (where an exploit mark sits on the curve)."""
    before = [y for x, y in zip(xs, ys) if x <= step]
    return before[-1] if before else (ys[0] if ys else None)


__all__ = ["plot_population", "population_config"]
