"""`podrace plot`: learning curves and where the time went, for one or several runs.

Reads what a run writes (config.json, metrics.jsonl). Each metrics line holds interval
means of per-rollout (actor) and per-update (learner) timers, so the seconds a component
took over a line's interval are its mean times the updates in that interval; summed over
the run that is the time one actor thread, or the learner thread, spent in it.
`actor/params_wait` is left out: it is a mean over waits only, not over rollouts.

Runs that differ only in their seed (and where they log, checkpoint and how often they
evaluate) are drawn as one curve: the mean over seeds with their range shaded
(`podrace.metrics.seed_curves`). `--reference VALUE:LABEL` adds a published figure as a
horizontal line.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import tyro
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from podrace import json_text
from podrace.config import ConfigError, TrainConfig
from podrace.config_dict import config_from_dict
from podrace.metrics.seed_curves import (
    Reference,
    draw_band,
    draw_references,
    mean_and_spread,
    parse_reference,
)
from podrace.metrics.ticks import SpacedLocator

FIGSIZE = (12.0, 9.0)
DPI = 100

# (metric, label) in stacking order; "other" is the rest of actor/rollout. The transfer to
# the learner devices comes after the rollout (timed apart), as does the queue put.
ACTOR_PARTS = (
    ("actor/env_step", "env step"),
    ("actor/inference", "inference"),
    ("actor/device_to_host", "device→host"),
)
ACTOR_AFTER_ROLLOUT = (
    ("actor/to_learner", "to learner devices"),
    ("actor/queue_put_wait", "queue put wait"),
)
LEARNER_PARTS = (
    ("learner/step", "learner step"),
    ("learner/queue_get_wait", "queue get wait"),
    ("learner/publish", "publish"),
)
OTHER = "other (rollout)"
COMPILED = "compiled env + policy steps"
"""A compiled rollout (`podrace.fused_rollout`: envpool on CPU) steps env and policy inside
XLA calls, so it has no env-step / inference / device-to-host timers: its rollout time is
this one part."""


@dataclass(frozen=True)
class PlotOptions:
    """Learning curves and a time breakdown of one or several runs, in one image."""

    run_dirs: Annotated[tyro.conf.Positional[tuple[Path, ...]], tyro.conf.arg(metavar="RUN_DIR")]
    """Run directories written by `podrace train`."""
    output: Annotated[Path, tyro.conf.arg(aliases=("-o",))]
    """Image to write (.png, .pdf, .svg, ...); replaced if it exists."""
    reference: Annotated[
        tuple[str, ...], tyro.conf.UseAppendAction, tyro.conf.arg(metavar="VALUE:LABEL")
    ] = ()
    """A published figure drawn as a horizontal line on the return axes, e.g.
    --reference 17.5:"Young & Tian AC(lambda) at 5M"; repeat for several."""

    def references(self) -> list[Reference]:
        return [parse_reference(text) for text in self.reference]


@dataclass(frozen=True)
class RunData:
    name: str
    cfg: TrainConfig
    lines: list[dict]


def load_run(run_dir: Path) -> RunData:
    """config.json and metrics.jsonl of a run; a truncated last line (killed run) is skipped.

    Anything else that is not a JSON object in UTF-8 is a ConfigError naming file and line.
    """
    run_dir = Path(run_dir)
    config_path, metrics_path = run_dir / "config.json", run_dir / "metrics.jsonl"
    for path in (config_path, metrics_path):
        if not path.is_file():
            raise ConfigError(f"{path} not found: is {run_dir} a podrace run directory?")
    try:
        config_bytes, raw = config_path.read_bytes(), metrics_path.read_bytes().splitlines()
    except OSError as error:
        raise ConfigError(f"cannot read {error.filename}: {error.strerror or error}") from None
    try:
        cfg = config_from_dict(
            json_text.loads(config_bytes.decode("utf-8")), where=str(config_path)
        )
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"{config_path} is not valid UTF-8: {error.reason} at byte {error.start}"
        ) from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"{config_path} is not valid JSON: {error}") from None
    lines = []
    for number, data in enumerate(raw, 1):
        try:
            line = json_text.loads(data.decode("utf-8"))
        except UnicodeDecodeError as error:
            problem = f"is not valid UTF-8: {error.reason} at byte {error.start}"
        except json.JSONDecodeError as error:
            problem = f"is not valid JSON: {error}"
        else:
            if isinstance(line, dict):
                lines.append(line)
                continue
            problem = f"is not a JSON object of metrics (got {type(line).__name__})"
        if number < len(raw):  # the last line may be cut short by a kill
            raise ConfigError(f"{metrics_path}:{number} {problem}")
    if not lines:
        raise ConfigError(f"{metrics_path} has no metric lines yet")
    return RunData(run_dir.absolute().name, cfg, lines)


MAX_PLOTTED = 1e100
"""Values of larger magnitude are left out of the figure (with one warning per run): near
float64's limit (1.8e308) matplotlib's ticks and transforms overflow (1e308 beside -1e308
ended in "arange: cannot compute length"), and no counter, clock or return of a real run
comes near. Within it, every derived value (steps of an evaluated version, seconds summed
over a run) stays far below the limit too."""

PLOTTED = (
    "version",
    "env_steps",
    "time_s",
    "episode/return",
    "eval/return",
    "eval/version",
    "actor/rollout",
    *(key for key, _ in ACTOR_PARTS + ACTOR_AFTER_ROLLOUT + LEARNER_PARTS),
)
"""The metrics the figure reads."""


def _number_in(value: object) -> float | None:
    """`value` as a float (an integer beyond float64: inf), None when it is no finite number."""
    if not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return math.inf
    return number if math.isfinite(number) else None


def _value(line: dict, key: str) -> float | None:
    """A metric as the figure draws it: None when missing, not finite or too extreme."""
    number = _number_in(line.get(key))
    return number if number is not None and abs(number) <= MAX_PLOTTED else None


def left_out(run: RunData) -> int:
    """How many of the metrics the figure reads are numbers too extreme to draw."""
    return sum(
        1
        for line in run.lines
        for key in PLOTTED
        if (number := _number_in(line.get(key))) is not None and abs(number) > MAX_PLOTTED
    )


def return_curve(run: RunData) -> tuple[list[float], list[float], list[float]]:
    """(env steps, wall-clock seconds, mean episode return) of every line that has one."""
    points = [
        (_value(line, "env_steps"), _value(line, "time_s"), _value(line, "episode/return"))
        for line in run.lines
    ]
    points = [p for p in points if None not in p]
    return [p[0] for p in points], [p[1] for p in points], [p[2] for p in points]


def eval_curve(run: RunData) -> tuple[list[float], list[float], list[float]]:
    """(env steps of the evaluated params, wall-clock seconds, evaluation return), once each."""
    steps, times, returns, seen = [], [], [], None
    for line in run.lines:
        version, value, t = (
            _value(line, "eval/version"),
            _value(line, "eval/return"),
            _value(line, "time_s"),
        )
        if None in (version, value, t) or version == seen:
            continue
        seen = version
        steps.append(version * run.cfg.steps_per_update)
        times.append(t)
        returns.append(value)
    return steps, times, returns


def time_breakdown(run: RunData) -> dict[str, dict[str, float]]:
    """Seconds per component over the run: {"actor": {label: s}, "learner": {label: s}}."""
    totals: dict[str, float] = {}
    previous = 0.0
    for line in run.lines:
        version = _value(line, "version")
        if version is None:
            continue
        updates, previous = version - previous, version
        for key in ("actor/rollout",) + tuple(
            k for k, _ in ACTOR_PARTS + ACTOR_AFTER_ROLLOUT + LEARNER_PARTS
        ):
            mean = _value(line, key)
            if mean is not None:
                totals[key] = totals.get(key, 0.0) + mean * updates
    rollout = totals.get("actor/rollout", 0.0)
    if "actor/env_step" in totals:
        actor = {label: totals.get(key, 0.0) for key, label in ACTOR_PARTS}
        actor[OTHER] = max(0.0, rollout - sum(actor.values()))
    else:
        actor = {COMPILED: rollout}
    actor.update({label: totals.get(key, 0.0) for key, label in ACTOR_AFTER_ROLLOUT})
    learner = {label: totals.get(key, 0.0) for key, label in LEARNER_PARTS}
    return {"actor": actor, "learner": learner}


def _number(x: float, _=None) -> str:
    """Tick label with thousands separators: 20,000 and 2.5 (not 2e+04, not 2 for 2.5);
    from 1e15 on a short 1.5e+20 (a label of 100 digits leaves no room for the axes)."""
    if abs(x) >= 1e15:
        return f"{x:.3g}"
    return f"{x:,.0f}" if x == round(x) else f"{x:,.2f}".rstrip("0")


def _thousands(axis) -> None:
    axis.set_major_formatter(FuncFormatter(_number))


def _title(runs: Sequence[RunData]) -> str:
    kinds = sorted({(r.cfg.env.id, r.cfg.algo.upper()) for r in runs})
    return " · ".join(kinds[0]) if len(kinds) == 1 else "; ".join(" · ".join(k) for k in kinds)


SEED_INDEPENDENT = ("seed", "log", "checkpoint", "safety", "eval")
"""Config sections that do not change what a run learns: runs that differ only in these are
seeds of one configuration."""


def _learning_config(cfg: TrainConfig) -> str:
    fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in SEED_INDEPENDENT}
    return json.dumps(fields, sort_keys=True, default=str)


def seed_groups(runs: Sequence[RunData]) -> list[list[RunData]]:
    """The runs in order, those of one configuration with distinct seeds (two or more)
    together; every other run alone (the same seed twice is two runs, not a spread)."""
    by_config: dict[str, list[RunData]] = {}
    for run in runs:
        by_config.setdefault(_learning_config(run.cfg), []).append(run)
    groups: list[list[RunData]] = []
    for members in by_config.values():
        seeds = [run.cfg.seed for run in members]
        if len(members) > 1 and len(set(seeds)) == len(seeds):
            groups.append(members)
        else:
            groups.extend([run] for run in members)
    return sorted(groups, key=lambda group: runs.index(group[0]))


def _draw_run(by_steps, by_time, run: RunData, color: str, label: str) -> None:
    steps, times, returns = return_curve(run)
    e_steps, e_times, e_returns = eval_curve(run)
    single = "o" if len(steps) == 1 else None  # a line of one point draws nothing
    by_steps.plot(steps, returns, color=color, label=label, marker=single)
    by_time.plot(times, returns, color=color, label=label, marker=single)
    by_steps.plot(e_steps, e_returns, color=color, linestyle="--", marker="o", markersize=4)
    by_time.plot(e_times, e_returns, color=color, linestyle="--", marker="o", markersize=4)


def _draw_seeds(by_steps, by_time, group: list[RunData], color: str, label: str) -> None:
    """The group's mean training and evaluation curves, each seed's range shaded."""
    train, evals = [return_curve(r) for r in group], [eval_curve(r) for r in group]
    for ax, x in ((by_steps, 0), (by_time, 1)):
        labelled = False
        for curves, style in ((train, "-"), (evals, "--")):
            band = mean_and_spread([(curve[x], curve[2]) for curve in curves])
            if band is not None:
                draw_band(ax, band, color, None if labelled else label, style)
                labelled = True


def plot_runs(run_dirs: Sequence[Path], references: Sequence[Reference] = ()) -> Figure:
    """The figure `podrace plot` saves: returns vs env steps and vs wall-clock, time bars;
    seeds of one configuration as their mean and range, `references` as horizontal lines."""
    if not run_dirs:
        raise ConfigError("name at least one run directory to plot")
    runs = [load_run(d) for d in run_dirs]
    for run_dir, run in zip(run_dirs, runs):
        if count := left_out(run):
            logging.getLogger(__name__).warning(
                "%s: %d metric values of magnitude beyond %g are left out of the figure",
                run_dir,
                count,
                MAX_PLOTTED,
            )
    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    grid = fig.add_gridspec(2, 2)
    by_steps, by_time, bars = (
        fig.add_subplot(grid[0, 0]),
        fig.add_subplot(grid[0, 1]),
        fig.add_subplot(grid[1, :]),
    )
    fig.suptitle(_title(runs), fontsize=14)
    label_kind = len({(r.cfg.env.id, r.cfg.algo) for r in runs}) > 1

    for i, group in enumerate(seed_groups(runs)):
        color, first = f"C{i % 10}", group[0]
        kind = f" ({first.cfg.env.id}, {first.cfg.algo})" if label_kind else ""
        if len(group) == 1:
            _draw_run(by_steps, by_time, first, color, first.name + kind)
        else:
            seeds = ", ".join(str(run.cfg.seed) for run in group)
            label = f"{first.cfg.name}{kind}: mean of seeds {seeds}, range shaded"
            _draw_seeds(by_steps, by_time, group, color, label)
    for ax in (by_steps, by_time):
        draw_references(ax, references)

    style = [
        Line2D([], [], color="grey", label="training episodes"),
        Line2D(
            [],
            [],
            color="grey",
            linestyle="--",
            marker="o",
            markersize=4,
            label="evaluation (greedy)",
        ),
    ]
    for ax, xlabel, title in (
        (by_steps, "env steps", "Return vs env steps"),
        (by_time, "wall-clock time (s)", "Return vs wall-clock time"),
    ):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("episode return")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        _thousands(ax.xaxis)
        _thousands(ax.yaxis)
        ax.xaxis.set_major_locator(SpacedLocator())
        handles, _ = ax.get_legend_handles_labels()
        ax.legend(handles=handles + style, fontsize=8, loc="best")

    _time_bars(bars, runs)
    return fig


def _time_bars(ax, runs: Sequence[RunData]) -> None:
    labels = (
        [label for _, label in ACTOR_PARTS]
        + [OTHER, COMPILED]
        + [label for _, label in ACTOR_AFTER_ROLLOUT]
        + [label for _, label in LEARNER_PARTS]
    )
    colors = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    ticks, names = [], []
    drawn: set[str] = set()
    for i, run in enumerate(runs):
        breakdown = time_breakdown(run)
        for j, thread in enumerate(("actor", "learner")):
            x = i * 3 + j
            bottom = 0.0
            for label, seconds in breakdown[thread].items():
                ax.bar(
                    x,
                    seconds,
                    bottom=bottom,
                    color=colors[label],
                    width=0.8,
                    label=None if label in drawn else label,
                )
                drawn.add(label)
                bottom += seconds
            ticks.append(x)
            names.append(
                f"{run.name}\n{'one actor thread' if thread == 'actor' else 'learner thread'}"
            )
    ax.set_xticks(ticks, names, fontsize=8)
    ax.set_ylabel("seconds (per thread, whole run)")
    ax.set_title("Where the time went")
    ax.grid(axis="y", alpha=0.3)
    _thousands(ax.yaxis)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
