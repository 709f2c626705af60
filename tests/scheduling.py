"""The order the suite runs its tests in: the longest first, so that with pytest-xdist no
long test starts late and runs on alone while the other test processes have finished.

pytest-xdist hands each test process the next tests of this order as it finishes one
(`--maxschedchunk=1` in pyproject.toml's addopts; without it the first test process would
be handed the first hundred tests, all of them long). The tests named in
tests/longest_tests.txt come first, in its order (longest first); then the other tests
marked `slow`; then the rest. Within each group the collection order stays, which keeps a
module's tests together for its module-scoped fixtures and caches.
"""

from __future__ import annotations

from pathlib import Path

import pytest

LONGEST = Path(__file__).with_name("longest_tests.txt")
"""Test ids, longest first: those of a measured run of the suite that took longest."""


def longest_tests(path: Path = LONGEST) -> list[str]:
    """The ids listed in `path`, one a line, blank lines and `#` comments left out."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def longest_first(items: list[pytest.Item], longest: list[str]) -> None:
    """Sort `items` in place: those in `longest` in its order, then slow ones, then the rest."""
    rank = {nodeid: i for i, nodeid in enumerate(longest)}

    def key(item: pytest.Item) -> int:
        if item.nodeid in rank:
            return rank[item.nodeid]
        return len(rank) + (0 if item.get_closest_marker("slow") else 1)

    items.sort(key=key)
