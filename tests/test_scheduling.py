"""The suite's run order (tests/scheduling.py): the longest tests first."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scheduling import LONGEST, longest_first, longest_tests


class FakeItem:
    def __init__(self, nodeid: str, slow: bool = False):
        self.nodeid, self.slow = nodeid, slow

    def get_closest_marker(self, name: str):
        return object() if name == "slow" and self.slow else None


@pytest.mark.timeout(30)
def test_listed_tests_come_first_in_the_lists_order_then_slow_ones_then_the_rest():
    items = [
        FakeItem("a::fast1"),
        FakeItem("a::slow1", slow=True),
        FakeItem("b::listed2"),
        FakeItem("b::fast2"),
        FakeItem("c::listed1", slow=True),
        FakeItem("c::slow2", slow=True),
    ]
    longest_first(items, ["c::listed1", "gone::since", "b::listed2"])
    assert [i.nodeid for i in items] == [
        "c::listed1",
        "b::listed2",
        "a::slow1",
        "c::slow2",
        "a::fast1",
        "b::fast2",
    ]


@pytest.mark.timeout(30)
def test_the_list_reads_ids_without_comments_or_blank_lines(tmp_path: Path):
    listing = tmp_path / "longest.txt"
    listing.write_text("# header\n\ntests/a.py::t[x-1]  # 300 s\ntests/b.py::u\n")
    assert longest_tests(listing) == ["tests/a.py::t[x-1]", "tests/b.py::u"]
    assert longest_tests(LONGEST)  # the suite's own list is not empty


@pytest.mark.timeout(30)
def test_the_suite_runs_with_one_test_handed_out_at_a_time(pytestconfig):
    """Without it xdist hands the first test process the first ~100 tests: the long ones."""
    assert pytestconfig.getoption("maxschedchunk") == 1
