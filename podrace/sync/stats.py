"""Tiny thread-safe running statistics, so every transport reports timings the same way."""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np


class RunningStat:
    """Count, last, mean and max of a measured quantity (e.g. seconds per publish)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.last = 0.0
        self.total = 0.0
        self.max = 0.0

    def add(self, value: float) -> None:
        with self._lock:
            self.count += 1
            self.last = value
            self.total += value
            self.max = max(self.max, value)

    def report(self, prefix: str) -> dict[str, float | int]:
        with self._lock:
            mean = self.total / self.count if self.count else 0.0
            return {
                f"{prefix}/count": self.count,
                f"{prefix}/last": self.last,
                f"{prefix}/mean": mean,
                f"{prefix}/max": self.max,
            }


def tree_nbytes(params: Any) -> int:
    """Bytes held by the array leaves of a pytree (no transfer, metadata only)."""
    import jax

    total = 0
    for leaf in jax.tree_util.tree_leaves(params):
        if hasattr(leaf, "dtype") and hasattr(leaf, "shape"):
            total += leaf.dtype.itemsize * math.prod(leaf.shape)  # np.prod cost 20 us per leaf
        else:  # Python scalar
            total += np.asarray(leaf).nbytes
    return total
