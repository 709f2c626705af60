"""What a population returns and tells a watcher: its members' results put together."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from podrace.runtime.result import TrainResult

if TYPE_CHECKING:
    from podrace.runtime.skeleton import Run


class PopulationCheckpoints:
    """The members' checkpoints as one (what the CLI's stop line names): the latest update
    every member has a complete checkpoint of, and a write some member abandons."""

    def __init__(self, runs: Callable[[], Sequence[Run]]):
        self.runs = runs
        """The members' runs built so far."""

    @property
    def latest(self) -> int | None:
        saved = [run.checkpoints.latest for run in self.runs()]
        return None if not saved or None in saved else min(saved)

    @property
    def writing(self) -> int | None:
        writing = [run.checkpoints.writing for run in self.runs()]
        return next((w for w in writing if w is not None), None)


def population_result(
    root: Path, checkpoint: int | None, results: dict[int, TrainResult]
) -> TrainResult:
    """The population's TrainResult: its run directory `root`, its `checkpoint`
    (`PopulationCheckpoints.latest`), every member's env steps and updates
    together, the best member's final evaluation, the members' results in `members`."""
    members = tuple(results[i] for i in sorted(results))
    evaluated = [r for r in members if r.final_eval is not None]
    best = max(evaluated, key=lambda r: r.final_eval.mean_return, default=None)
    first = members[0]
    return replace(
        first,
        run_dir=root,
        updates=sum(r.updates for r in members),
        env_steps=sum(r.env_steps for r in members),
        compile_s=sum(r.compile_s for r in members),
        train_s=max(r.train_s for r in members),
        learn_s=max(r.learn_s for r in members),
        final_eval=best.final_eval if best is not None else None,
        max_policy_lag=max(r.max_policy_lag for r in members),
        skipped_updates=sum(r.skipped_updates for r in members),
        checkpoint=checkpoint,
        members=members,
    )


__all__ = ["PopulationCheckpoints", "population_result"]
