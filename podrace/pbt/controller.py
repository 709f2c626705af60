"""The decisions of population-based training, as pure functions of their inputs: when a
member's interval is up, whom it copies (exploit) and which hyperparameters it continues
with (explore). No threads, files or arrays: `podrace.runtime.population` applies them.

Randomness comes from `decision_rng(seed, member, interval)` alone, so a decision depends
only on the scores it is given and where it is taken, never on what was drawn before (a
resumed population needs no saved random state).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from podrace.pbt.config import Mutable


def intervals_done(env_steps: int, interval_steps: int) -> int:
    """How many of a member's intervals `env_steps` of its own steps complete."""
    return env_steps // interval_steps


def decision_rng(seed: int, member: int, interval: int) -> np.random.Generator:
    """The random numbers of member `member`'s decision at the end of interval `interval`
    (0: its starting hyperparameters)."""
    return np.random.default_rng([seed, 50, member, interval])


def ranked(scores: Mapping[int, float]) -> list[int]:
    """Members best first (higher score first; a tie: the lower member id first); members
    whose score is NaN are left out."""
    known = [m for m, s in scores.items() if not math.isnan(s)]
    return sorted(known, key=lambda m: (-scores[m], m))


def exploit_source(
    member: int, scores: Mapping[int, float], bottom_fraction: float, rng: np.random.Generator
) -> int | None:
    """The member `member` copies, drawn from the top fraction, when it ranks in the bottom
    `bottom_fraction` of the members that have a score; None when it does not (or has no
    score, or is the only one with a score, or the member drawn scores no better than it:
    members that tie keep their own states). Each fraction holds at least one member."""
    order = ranked(scores)
    if member not in order or len(order) < 2:
        return None
    count = max(1, math.floor(len(order) * bottom_fraction))
    if member not in order[-count:]:
        return None
    source = int(order[rng.integers(count)])
    return source if scores[source] > scores[member] else None


def explore(
    values: Mapping[str, float],
    space: Mapping[str, Mutable],
    factors: Sequence[float],
    resample_probability: float,
    rng: np.random.Generator,
) -> dict[str, float]:
    """`values` perturbed, every name of `space` (in its order): with
    `resample_probability` drawn afresh within its bounds, else multiplied by one of
    `factors` (a `complement` one: 1 - value is), then clipped to its bounds."""
    out = dict(values)
    for name, bounds in space.items():
        value = float(values[name])
        if rng.random() < resample_probability:
            value = _resample(bounds, rng)
        else:
            factor = float(factors[rng.integers(len(factors))])
            value = 1 - (1 - value) * factor if bounds.scale == "complement" else value * factor
        out[name] = float(np.clip(value, bounds.low, bounds.high))
    return out


def _resample(bounds: Mutable, rng: np.random.Generator) -> float:
    if bounds.scale == "log" and bounds.low > 0:
        return float(np.exp(rng.uniform(np.log(bounds.low), np.log(bounds.high))))
    if bounds.scale == "complement" and bounds.high < 1:  # 1 - value, log-uniformly
        return 1 - float(np.exp(rng.uniform(np.log(1 - bounds.high), np.log(1 - bounds.low))))
    return float(rng.uniform(bounds.low, bounds.high))


def starting_hyperparameters(
    values: Mapping[str, float],
    space: Mapping[str, Mutable],
    factors: Sequence[float],
    resample_probability: float,
    seed: int,
    member: int,
) -> dict[str, float]:
    """Member `member`'s first hyperparameters: member 0 starts with the config's `values`,
    every other member with each drawn within its bounds (as a resample draws it): a
    population starts as a random search around the config."""
    if member == 0:
        return {name: float(values[name]) for name in space}
    rng = decision_rng(seed, member, 0)
    return explore(values, space, factors, 1.0, rng)


__all__ = [
    "decision_rng",
    "explore",
    "exploit_source",
    "intervals_done",
    "ranked",
    "starting_hyperparameters",
]
