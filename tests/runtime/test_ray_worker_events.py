"""Each Ray worker lost, restarted or joined during a run is one line of podrace's and a
count in the metrics (a fake Ray: no cluster starts)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from tests.runtime.fake_ray import FakeRay, Worker, fake_run, make_collector, node

ray = pytest.importorskip("ray")


@pytest.mark.timeout(60)
def test_every_worker_lost_restarted_or_joined_during_the_run_is_one_line_and_counted(caplog):
    caplog.set_level(logging.INFO, logger="podrace")
    nodes = [node("head", 1), node("a", 2)]
    run = fake_run(num_workers="auto", data_order="elastic", rollouts_per_update=2)
    order = SimpleNamespace(started=lambda slot: None, lost=lambda slot: None)
    order.wanted = lambda slot: True
    collector, remote = make_collector(run, order, FakeRay(nodes))
    collector.look_at_cluster()
    for handle, slot in zip(remote.launched, collector.slots):
        Worker(handle).start("a" * 56, 4242)
        collector._started(slot)  # the run's first workers: the run's start says so
    assert not caplog.records

    collector.running = True
    Worker(remote.launched[1]).die()
    collector.step(0)
    Worker(remote.launched[-1]).start("a" * 56, 4242)
    collector.step(0)
    nodes.append(node("b", 1))
    collector.look_at_cluster()
    Worker(remote.launched[-1]).start("b" * 56, 4343)
    collector.step(0)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert len(lines) == 3, lines
    assert lines[0] == (
        "WARNING",
        "ray worker 1 lost on node aaaaaaaa (ActorDiedError: The actor died unexpectedly "
        "before finishing this task.); restarting it, restart 1 of 3 (--ray.max-restarts)",
    )
    assert lines[1:] == [
        ("INFO", "ray worker 1 restarted on node aaaaaaaa (pid 4242)"),
        ("INFO", "ray worker 3 joined on node bbbbbbbb (pid 4343): 4 alive"),
    ]
    counts = run.metrics.counts
    assert (counts["ray/restarts"], counts["ray/worker-1/restarts"], counts["ray/joins"]) == (
        1,
        1,
        1,
    )
