"""Thread-safe metric accumulation: components add, the logger collects once per interval.

`add` accumulates a value whose mean over the interval is reported (timers, losses, lag);
`set` keeps the last value (evaluation return, version); `count` sums events (steps,
dropped evaluations). Collecting resets the means, so each log line is a rolling mean over
its own interval, while counters keep growing.
"""

from __future__ import annotations

import threading
from collections import defaultdict


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums: dict[str, float] = defaultdict(float)
        self._counts: dict[str, int] = defaultdict(int)
        self._last: dict[str, float] = {}
        self._totals: dict[str, float] = defaultdict(float)

    def add(self, name: str, value: float) -> None:
        with self._lock:
            self._sums[name] += value
            self._counts[name] += 1

    def add_many(self, values: dict[str, float]) -> None:
        with self._lock:
            for name, value in values.items():
                self._sums[name] += value
                self._counts[name] += 1

    def add_values(self, name: str, values) -> None:
        """Add every element of `values` (e.g. the returns of several episodes)."""
        if len(values) == 0:
            return
        with self._lock:
            self._sums[name] += float(sum(values))
            self._counts[name] += len(values)

    def set(self, name: str, value: float) -> None:
        with self._lock:
            self._last[name] = value

    def count(self, name: str, amount: float = 1) -> None:
        with self._lock:
            self._totals[name] += amount

    def total(self, name: str) -> float:
        with self._lock:
            return self._totals.get(name, 0.0)

    def totals(self) -> dict[str, float]:
        """Every running total (`count`) so far: what a checkpoint keeps of the counters."""
        with self._lock:
            return dict(self._totals)

    def last(self, name: str, default: float | None = None) -> float | None:
        with self._lock:
            return self._last.get(name, default)

    def collect(self) -> dict[str, float]:
        """Means since the previous collect, plus last values and running totals."""
        with self._lock:
            out = {name: self._sums[name] / self._counts[name] for name in self._sums}
            self._sums.clear()
            self._counts.clear()
            out.update(self._last)
            out.update(self._totals)
        return out
