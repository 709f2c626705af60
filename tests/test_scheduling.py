"""The suite's run order (tests/scheduling.py): the longest tests first, one at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scheduling import LONGEST, LongestFirstScheduling, longest_first, longest_tests


class FakeItem:
    def __init__(self, nodeid: str):
        self.nodeid = nodeid


@pytest.mark.timeout(30)
def test_listed_tests_come_first_in_the_lists_order_then_the_rest_as_collected():
    items = [FakeItem(i) for i in ("a::1", "a::2", "b::listed2", "b::3", "c::listed1", "c::4")]
    longest_first(items, ["c::listed1", "gone::since", "b::listed2"])
    assert [i.nodeid for i in items] == ["c::listed1", "b::listed2", "a::1", "a::2", "b::3", "c::4"]


@pytest.mark.timeout(30)
def test_the_list_reads_ids_without_comments_or_blank_lines(tmp_path: Path):
    listing = tmp_path / "longest.txt"
    listing.write_text("# header\n\ntests/a.py::t[x-1]  # 300 s\ntests/b.py::u\n")
    assert longest_tests(listing) == ["tests/a.py::t[x-1]", "tests/b.py::u"]
    assert longest_tests(LONGEST)  # the suite's own list is not empty


class FakeNode:
    """What xdist's scheduler uses of a test process: its id, and tests sent to it."""

    def __init__(self, name: str):
        self.gateway = type("Gateway", (), {"id": name})()
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def _scheduled(pytestconfig, monkeypatch, longest: int) -> tuple[LongestFirstScheduling, list]:
    """A scheduler for 3 fake test processes and `longest` listed tests before 120 others,
    after its first round of sending."""
    listed = [f"long::{i}" for i in range(longest)]
    collection = listed + [f"short::{i}" for i in range(120)]
    monkeypatch.setattr(pytestconfig.option, "tx", ["popen"] * 3, raising=False)
    monkeypatch.setattr(pytestconfig.option, "numprocesses", 3, raising=False)
    monkeypatch.setattr(pytestconfig.option, "maxschedchunk", None, raising=False)
    scheduler = LongestFirstScheduling(pytestconfig, longest=listed)
    nodes = [FakeNode(f"gw{i}") for i in range(3)]
    for node in nodes:
        scheduler.add_node(node)
    for node in nodes:
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    return scheduler, nodes


@pytest.mark.timeout(30)
def test_the_longest_go_out_one_at_a_time_then_the_rest_in_chunks(pytestconfig, monkeypatch):
    scheduler, nodes = _scheduled(pytestconfig, monkeypatch, longest=6)
    # Two each to start (a worker starts a test once it knows the next): the six longest.
    assert [node.sent for node in nodes] == [[0, 1], [2, 3], [4, 5]]
    scheduler.mark_test_complete(nodes[1], 2, duration=50.0)
    # Past the listed tests: xdist's usual chunk of consecutive tests.
    assert nodes[1].sent[:3] == [2, 3, 6] and len(nodes[1].sent) > 10
    assert nodes[1].sent == sorted(nodes[1].sent)


@pytest.mark.timeout(30)
def test_a_free_process_takes_the_next_longest_test_alone(pytestconfig, monkeypatch):
    scheduler, nodes = _scheduled(pytestconfig, monkeypatch, longest=9)
    scheduler.mark_test_complete(nodes[2], 4, duration=50.0)
    assert nodes[2].sent == [4, 5, 6]
    scheduler.mark_test_complete(nodes[0], 0, duration=300.0)
    assert nodes[0].sent == [0, 1, 7]
