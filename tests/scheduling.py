"""The order the suite runs its tests in: its longest tests first, so that with
pytest-xdist none of them starts late and runs on alone after the other test processes
have finished.

The tests named in tests/longest_tests.txt come first, in its order (longest first); the
rest follow in collection order. `LongestFirstScheduling` (pytest-xdist's load scheduling,
chosen in tests/conftest.py) hands the listed tests out one at a time, so that a free test
process always takes the longest test left; then the rest in xdist's usual chunks of
consecutive tests, which keeps a module's tests in one process for its module-scoped
fixtures (a local Ray, say) and its compiled programs.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScheduling

LONGEST = Path(__file__).with_name("longest_tests.txt")
"""Test ids, longest first: those of a measured run of the suite that took longest."""


def longest_tests(path: Path = LONGEST) -> list[str]:
    """The ids listed in `path`, one a line, blank lines and `#` comments left out."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def longest_first(items: list[pytest.Item], longest: list[str]) -> None:
    """Sort `items` in place: those in `longest` in its order, then the rest as they were."""
    rank = {nodeid: i for i, nodeid in enumerate(longest)}
    items.sort(key=lambda item: rank.get(item.nodeid, len(rank)))


class LongestFirstScheduling(LoadScheduling):
    """xdist's load scheduling, except that while the next pending test is one of `longest`
    a test process is given one test at a time (two when it has none: an xdist worker
    starts a test only once it knows the next)."""

    def __init__(self, config: pytest.Config, log: Any = None, longest: Iterable[str] = ()):
        super().__init__(config, log)
        self.longest = set(longest)

    def _send_tests(self, node: Any, num: int) -> None:
        if self.pending and self.collection[self.pending[0]] in self.longest:
            num = max(1, 2 - len(self.node2pending[node]))
        super()._send_tests(node, num)
