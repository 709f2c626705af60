"""What a Ray worker's death does to the data, with a fake Ray (no cluster starts): the
collector and the real data orders (fixed: `FixedOrder` into a `Pipeline`; elastic:
`ElasticOrder` into an `ElasticPipeline`), the learner's side played by the test."""

from __future__ import annotations

import collections
from types import SimpleNamespace

import pytest

from podrace.pipeline import Pipeline
from podrace.runtime.ray.elastic import ElasticPipeline
from tests.runtime.fake_ray import FakeRay, Worker, fake_run, make_collector

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.timeout(60)

LAG = 3
"""max_policy_lag: a worker runs up to LAG + 1 rollouts ahead of a learner at version 0."""
UPDATES = 8


def run_changes(**more) -> dict:
    """Two workers of 4 envs, 8 steps a rollout: UPDATES updates."""
    return {
        "total_steps": UPDATES * 2 * 4 * 8,
        "env.num_envs": 4,
        "rollout_length": 8,
        "layout.max_policy_lag": LAG,
        **more,
    }


def used_once(stamps: list[tuple[int, int, int]], workers: int) -> None:
    pairs = collections.Counter((actor, seq) for actor, _, seq in stamps)
    twice = sorted(pair for pair, n in pairs.items() if n > 1)
    assert not twice, f"(actor, seq) used more than once: {twice}"
    assert set(pairs) == {(a, s) for a in range(workers) for s in range(UPDATES)}


def test_fixed_order_a_worker_lost_with_finished_rollouts_waiting_for_the_learner():
    """Worker 0 finishes rollouts 0-3 while the learner is still at version 0 (lag 3), and
    dies before the learner took any: they are all used, once, and its replacement starts
    at rollout 4, so no (actor, seq) is collected twice."""
    from podrace.runtime.ray.orders import FixedOrder
    from podrace.runtime.ray.restarts import Slot

    run = fake_run(changes=run_changes(), num_workers=2)
    assert run.cfg.num_updates == UPDATES and run.cfg.max_policy_lag == LAG
    pipeline = Pipeline(2, UPDATES, LAG, run.lifetime)
    order = FixedOrder(run, pipeline)
    collector, remote = make_collector(run, order, FakeRay(), elastic=False)
    collector.add([Slot(0), Slot(1)])
    first, other = (Worker(handle) for handle in remote.launched)
    first.start()
    other.start()
    collector.step(0)
    for _ in range(LAG + 1):
        first.deliver(version=0)
        collector.step(0)
    other.deliver(version=0)
    collector.step(0)
    first.die()
    collector.step(0)
    replacement = Worker(remote.launched[-1])
    assert (replacement.spec.restart, replacement.spec.first_seq) == (1, LAG + 1)
    replacement.start()
    collector.step(0)
    for worker in (replacement, other):
        while worker.next_seq < UPDATES:
            worker.deliver(version=max(0, worker.next_seq - LAG))
            collector.step(0)
    assert not replacement.handle.pending("next") and not other.handle.pending("next")
    for worker_id in (0, 1):
        order.pump(worker_id, 0)
    for version in range(UPDATES):  # raises on a seq out of order or over the lag bound
        pipeline.next_batch(version)
    stamps = pipeline.consumed.stamps()
    used_once(stamps, 2)
    assert [r for a, r, _ in stamps if a == 0] == [0] * (LAG + 1) + [1] * (UPDATES - LAG - 1)
    assert run.metrics.total("ray/restarts") == 1


def test_elastic_order_a_worker_lost_with_finished_rollouts_waiting_for_the_learner():
    """Worker 0 delivers three rollouts that wait for a slow learner, then dies: the learner
    still takes each of them once, and no (actor, seq) is made or used again (its
    replacement continues at seq 3)."""
    from podrace.runtime.ray.orders import ElasticOrder
    from podrace.runtime.ray.restarts import Slot

    changes = run_changes(**{"layout.max_policy_lag": 2})
    run = fake_run(changes=changes, num_workers=2, data_order="elastic", rollouts_per_update=2)
    collectors = []
    pipeline = ElasticPipeline(2, 2, run.lifetime, grant=lambda g: collectors[0].grant(g))
    run.pipeline = pipeline
    collector, remote = make_collector(run, ElasticOrder(run), FakeRay())
    collectors.append(collector)
    collector.add([Slot(0), Slot(1)])
    workers = {0: Worker(remote.launched[0]), 1: Worker(remote.launched[1])}
    for worker in workers.values():
        worker.start()
    collector.step(0)
    for _ in range(3):
        assert workers[0].credits > 0
        workers[0].deliver(version=0)
        collector.step(0)
    workers[0].die()
    collector.step(0)
    workers[0] = Worker(remote.launched[-1])
    assert (workers[0].spec.restart, workers[0].spec.first_seq) == (1, 3)
    workers[0].start()
    collector.step(0)
    waiting = 3
    for version in range(UPDATES):
        while waiting < 2:  # a worker with a credit delivers
            ready = [worker for worker in workers.values() if worker.credits > 0]
            assert ready, "no worker may make a rollout: the learner would wait forever"
            ready[version % len(ready)].deliver(version=version)
            waiting += 1
            collector.step(0)
        pipeline.next_batch(version)
        waiting -= 2
    stamps = pipeline.consumed.stamps()
    assert {(0, 0, s) for s in range(3)} <= set(stamps)  # the lost worker's rollouts
    pairs = collections.Counter((actor, seq) for actor, _, seq in stamps)
    assert all(n == 1 for n in pairs.values()), pairs
    assert pipeline.dropped == 0 and run.metrics.total("ray/restarts") == 1


def test_elastic_replacements_that_die_before_delivering_use_up_max_restarts():
    """A worker that delivered may be lost any number of times (its node preempted), but
    replacements that keep dying before they deliver anything are a crash loop: the run
    fails once they die more often than `ray.max_restarts`, though an earlier incarnation
    of the worker delivered."""
    from podrace.runtime.ray.restarts import RunFails, Slot, WorkerCrashLoop

    run = fake_run(changes=run_changes(), num_workers=1, data_order="elastic", max_restarts=2)
    order = SimpleNamespace(started=lambda slot: None, lost=lambda slot: None)
    order.received, order.wanted = (lambda slot, shipment: None), (lambda slot: True)
    collector, remote = make_collector(run, order, FakeRay())
    collector.add([Slot(0)])

    def incarnation() -> Worker:
        return Worker(remote.launched[-1])

    worker = incarnation()
    worker.start()
    collector.step(0)
    for _ in range(2):
        worker.deliver()
        collector.step(0)
    for _ in range(3):  # lost after delivering: restarted, whatever the limit
        worker.die()
        collector.step(0)
        worker = incarnation()
        worker.start()
        collector.step(0)
        worker.deliver()
        collector.step(0)
    worker.die()
    collector.step(0)
    # From here on the replacements die before delivering: starting, or started.
    incarnation().die_starting()
    collector.step(0)
    worker = incarnation()
    worker.start()
    collector.step(0)
    worker.die()
    collector.step(0)
    assert len(remote.launched) == 7 and run.metrics.total("ray/restarts") == 6
    incarnation().die_starting()
    with pytest.raises(RunFails) as failed:
        collector.step(0)
    assert isinstance(failed.value.error, WorkerCrashLoop), failed.value.error
    assert "failed 3 times, restart limit 2" in str(failed.value.error)
    assert failed.value.component == "ray-worker-0" and len(remote.launched) == 7
