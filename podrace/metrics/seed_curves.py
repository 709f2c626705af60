"""Curves of several seeds of one configuration drawn as one: their mean, with the range
between the lowest and the highest seed shaded; and horizontal lines for published figures.

Seeds are evaluated (or log) at different steps, so each seed's curve is interpolated onto
the steps where any of them has a point, within the span every seed covers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from podrace.config import ConfigError

Curve = tuple[Sequence[float], Sequence[float]]
"""(x values, ascending; y values) of one seed."""


@dataclass(frozen=True)
class Band:
    x: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    seeds: int


def mean_and_spread(curves: Sequence[Curve]) -> Band | None:
    """Mean, lowest and highest of the curves at the union of their x values inside the span
    they all cover; None when a curve is empty or the curves share no span."""
    if not curves or any(len(x) == 0 for x, _ in curves):
        return None
    start = max(min(x) for x, _ in curves)
    end = min(max(x) for x, _ in curves)
    if start > end:
        return None
    grid = np.unique(np.concatenate([np.asarray(x, float) for x, _ in curves]))
    grid = grid[(grid >= start) & (grid <= end)]
    values = np.stack(
        [np.interp(grid, np.asarray(x, float), np.asarray(y, float)) for x, y in curves]
    )
    return Band(grid, values.mean(axis=0), values.min(axis=0), values.max(axis=0), len(curves))


def draw_band(ax, band: Band, color: str, label: str | None, linestyle: str = "-") -> None:
    """The mean as a line (a point when there is one x), the seeds' range shaded."""
    single = "o" if len(band.x) == 1 else None
    ax.plot(band.x, band.mean, color=color, label=label, linestyle=linestyle, marker=single)
    ax.fill_between(band.x, band.low, band.high, color=color, alpha=0.2, linewidth=0)


@dataclass(frozen=True)
class Reference:
    """A published figure to compare against: a horizontal line labelled with its source."""

    value: float
    label: str


def parse_reference(text: str) -> Reference:
    """'VALUE:LABEL' (e.g. '17.5:Young & Tian AC(lambda) at 5M'); ConfigError otherwise."""
    value, colon, label = text.partition(":")
    number = None
    if re.fullmatch(r"\s*[-+]?[0-9.]+(e[-+]?[0-9]+)?\s*", value, re.IGNORECASE):
        try:
            number = float(value)
        except ValueError:
            number = None
    if not colon or number is None or not math.isfinite(number) or not label.strip():
        raise ConfigError(
            f'--reference takes VALUE:LABEL (e.g. 17.5:"Young & Tian AC(lambda) at 5M"), '
            f"got {text!r}"
        )
    return Reference(number, label.strip())


def draw_references(ax, references: Sequence[Reference]) -> None:
    for i, reference in enumerate(references):
        ax.axhline(
            reference.value,
            color="black",
            linestyle=(":", "-.", (0, (5, 2)))[i % 3],
            linewidth=1.2,
            label=f"{reference.label} ({reference.value:g})",
        )
