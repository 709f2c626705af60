"""`--pbt.*`: population-based training settings, and which hyperparameters each algorithm
lets a population change (and within which bounds). Imports nothing of JAX: the CLI reads
the config before it sets XLA flags."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Mutable:
    """A hyperparameter a population may change, and how."""

    low: float
    high: float
    """Bounds every perturbed or resampled value is clipped to."""
    scale: Literal["log", "linear", "complement"]
    """`log`: perturbed by multiplying the value, resampled log-uniformly; `linear`:
    multiplied, resampled uniformly; `complement` (discounts): 1 - value is multiplied (0.99
    x 1.2 is 0.988, a shorter horizon) and resampled log-uniformly (uniformly where the
    upper bound is 1)."""


MUTABLE: dict[str, dict[str, Mutable]] = {
    "ppo": {
        "learning_rate": Mutable(1e-6, 1e-2, "log"),
        "ent_coef": Mutable(0.0, 0.02, "linear"),
        "clip_coef": Mutable(0.1, 0.3, "linear"),
        "gamma": Mutable(0.95, 0.9999, "complement"),
        "gae_lambda": Mutable(0.9, 1.0, "complement"),
    },
    "impala": {
        "learning_rate": Mutable(1e-6, 1e-2, "log"),
        "ent_coef": Mutable(0.0, 0.02, "linear"),
        "gamma": Mutable(0.95, 0.9999, "complement"),
        "vtrace_lambda": Mutable(0.9, 1.0, "complement"),
    },
}
"""Per algorithm (`algo`): the hyperparameters a population may change, under their names in
--ppo.* / --impala.*. A change never recompiles the update: they are inputs of it."""


@dataclass(frozen=True)
class PBTConfig:
    """Population-based training: several members, each with its own learner state and
    hyperparameters, training side by side; every `interval_steps` a member near the bottom
    copies a top member's learner state and perturbs its hyperparameters
    (docs/guides/pbt.md)."""

    population: int = 1
    """Members trained side by side in this process; 1 trains one run (no PBT)."""
    interval_steps: int = 50_000
    """A member's own env steps between two of its rankings (exploit and explore)."""
    metric: str = "eval/return"
    """The metric members are ranked on, higher is better: any name a run's metrics lines
    hold (`eval/return` needs --eval.every-updates; `episode/return`; `info/<key>`: a value
    a Gymnasium env reports in its info as an episode ends)."""
    bottom_fraction: float = 0.25
    """A member ranked in this bottom fraction copies a member of the same top fraction (at
    least one member each)."""
    perturb_factors: tuple[float, ...] = (0.8, 1.2)
    """Explore: each hyperparameter is multiplied by one of these, drawn at random."""
    resample_probability: float = 0.25
    """Explore: the chance that a hyperparameter is drawn afresh within its bounds instead."""
    mutate: tuple[str, ...] | None = None
    """The hyperparameters members change (names under --ppo.* or --impala.*, e.g.
    `learning_rate ent_coef`); None: every one the algorithm allows."""
    member: int | None = None
    """Set by a population on its members' configs (which member this is); not a flag to
    pass."""

    def mutated(self, algo: str) -> tuple[str, ...]:
        """The names of the hyperparameters members of an `algo` population change."""
        return tuple(MUTABLE[algo]) if self.mutate is None else self.mutate


__all__ = ["MUTABLE", "Mutable", "PBTConfig"]
