"""What a run returns (`podrace.train`, `podrace.runtime.run.run_to_end`), whatever its
topology."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podrace.evaluate import EvalResult


@dataclass(frozen=True)
class TrainResult:
    """What a run returns, whatever its topology."""

    run_dir: Path
    """This process's run directory (process i > 0 of a multi-host run: its own part)."""
    updates: int
    env_steps: int
    compile_s: float
    train_s: float
    learn_s: float
    """Seconds from starting the threads until the last update was published (train_s also
    counts the final evaluation and shutdown)."""
    final_eval: EvalResult | None
    max_policy_lag: float
    skipped_updates: int = 0
    """Updates skipped as non-finite (safety.on_nonfinite=skip), the run's earlier parts
    included."""
    checkpoint: int | None = None
    """Version of the run's latest complete checkpoint: the last this run wrote, else the
    one it resumed from (None: none)."""
    topology: str = "threads"
    """`threads`, `ray` or `multihost`."""
    ray: Any = None
    """The Ray-worker fleet's report (`podrace.runtime.ray.workers.RayReport`); else None."""
    members: tuple[TrainResult, ...] = ()
    """A population's members' results, member 0 first (their env steps and updates are
    summed above, `final_eval` is the best member's); empty for one run."""


__all__ = ["TrainResult"]
