"""The grids of `benchmarks/learning.py`: which tasks, presets and budget each suite runs,
and where each run's directory and result JSON live.

A run is one (suite, task, preset, seed). Its directory (checkpoints, metrics) lives under
`runs/learning/<suite>/` (outside git); its result under
`benchmarks/results/learning/<suite>/<preset>__<task-slug>__s<seed>.json` (committed).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "learning"
RUNS = REPO / "runs" / "learning"

MINATAR_GAMES = ("Breakout", "Asterix", "Freeway", "Seaquest", "SpaceInvaders")
MINATAR_TASKS = tuple(f"MinAtar/{game}-v1" for game in MINATAR_GAMES)


@dataclass(frozen=True)
class Suite:
    name: str
    title: str
    tasks: tuple[str, ...]
    presets: tuple[str, ...]
    total_steps: int
    """Env (agent) steps of every run of the suite."""
    budget: str
    """The budget as the literature states it."""
    reported: bool = True
    """Whether docs/results.md shows the suite (the smoke suite checks the runner only)."""


SUITES: dict[str, Suite] = {
    suite.name: suite
    for suite in (
        Suite(
            "minatar",
            "MinAtar at 5M steps (the MinAtar paper's budget)",
            MINATAR_TASKS,
            ("minatar-ppo", "minatar-impala"),
            5_000_000,
            "5M steps",
        ),
        Suite(
            "minatar20m",
            "MinAtar at 20M steps (Pgx's PPO budget)",
            MINATAR_TASKS,
            ("minatar-ppo",),
            20_000_000,
            "20M steps",
        ),
        Suite(
            "mujoco",
            "MuJoCo at 1M steps",
            ("HalfCheetah-v4", "Hopper-v4"),
            ("mujoco-ppo",),
            1_000_000,
            "1M steps",
        ),
        Suite(
            "atari",
            "Atari at 10M frames (a GPU machine)",
            ("Pong-v5", "Breakout-v5"),
            ("atari-ppo",),
            2_500_000,
            "10M frames (2.5M agent steps)",
        ),
        Suite(
            "smoke",
            "CartPole: a check of the runner itself, not a result",
            ("CartPole-v1",),
            ("cartpole-ppo",),
            100_000,
            "100k steps",
            reported=False,
        ),
    )
}


def task_slug(task: str) -> str:
    """The task id as one path component: MinAtar/Breakout-v1 -> MinAtar-Breakout-v1."""
    return task.replace("/", "-")


@dataclass(frozen=True)
class RunSpec:
    suite: Suite
    task: str
    preset: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.preset}__{task_slug(self.task)}__s{self.seed}"

    def run_dir(self, runs: Path) -> Path:
        return runs / self.suite.name / self.name

    def result_path(self, results: Path) -> Path:
        return results / self.suite.name / f"{self.name}.json"

    def segments_path(self, runs: Path) -> Path:
        """The runner's record of each launch (wall time, exit code), beside the run dir:
        the run directory itself must not exist before `podrace train` makes it."""
        return runs / self.suite.name / f"{self.name}.segments.json"

    def log_path(self, runs: Path) -> Path:
        return runs / self.suite.name / f"{self.name}.log"


class GridError(ValueError):
    """A task or preset asked for that the suite does not have."""


def grid(
    suite: Suite, seeds: int, tasks: tuple[str, ...] = (), presets: tuple[str, ...] = ()
) -> list[RunSpec]:
    """The suite's runs, seed-major (every task and preset at seed 1 before seed 2), narrowed
    to `tasks` and `presets` when given; GridError naming a task or preset not in the suite."""
    for wanted, have, what in ((tasks, suite.tasks, "task"), (presets, suite.presets, "preset")):
        unknown = [w for w in wanted if w not in have]
        if unknown:
            raise GridError(
                f"{what} {unknown[0]!r} is not in suite {suite.name!r} ({', '.join(have)})"
            )
    return [
        RunSpec(suite, task, preset, seed)
        for seed in range(1, seeds + 1)
        for task in suite.tasks
        if not tasks or task in tasks
        for preset in suite.presets
        if not presets or preset in presets
    ]
