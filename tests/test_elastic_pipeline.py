"""The elastic data order's pipeline: arrival order, a fixed batch, credits and their floors,
lost and silent workers, stale rollouts, and the set of consumed stamps."""

from __future__ import annotations

import threading

import pytest

from podrace.control import Lifetime, Stopped
from podrace.runtime.ray.elastic import ConsumedSet, ElasticPipeline
from tests.helpers.rollouts import empty_rollout
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(30)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Granted:
    """Records grants: worker -> [floor of every credit granted, in order]."""

    def __init__(self) -> None:
        self.floors: dict = {}

    def __call__(self, grants) -> None:
        for worker, n, floor in grants:
            self.floors.setdefault(worker, []).extend([floor] * n)

    def total(self, worker) -> int:
        return len(self.floors.get(worker, []))


def pipeline(batch=2, lag=1, **kwargs):
    granted, clock = Granted(), Clock()
    p = ElasticPipeline(batch, lag, Lifetime(), grant=granted, clock=clock, **kwargs)
    return p, granted, clock


def test_each_update_takes_the_first_rollouts_to_arrive_from_any_workers():
    p, granted, _ = pipeline(batch=2)
    p.join(0, 1)
    assert granted.floors == {0: [0, 0], 1: [0, 0]}  # as the fixed order: rollouts 0 and 1
    p.deliver(1, empty_rollout(1, 0, 0))
    p.deliver(1, empty_rollout(1, 1, 0))  # worker 1 is faster: both its rollouts come first
    p.deliver(0, empty_rollout(0, 0, 0))
    batch, stats = p.next_batch(0)
    assert [(r.actor_id, r.seq) for r in batch] == [(1, 0), (1, 1)]
    assert stats["lag_max"] == 0
    # The credits update 0 freed are for rollouts made with what it publishes (version 1).
    assert granted.floors == {0: [0, 0, 1], 1: [0, 0, 1]}
    p.deliver(0, empty_rollout(0, 1, 0))
    batch, stats = p.next_batch(1)
    assert [(r.actor_id, r.seq) for r in batch] == [(0, 0), (0, 1)]
    assert stats["lag_max"] == 1 and p.dropped == 0
    assert p.consumed.stamps() == [(0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1)]


def test_credits_bound_the_work_out_to_the_fixed_orders():
    p, granted, _ = pipeline(batch=3, lag=1)
    p.join(*range(5))  # more workers than one update takes
    assert p.credits_out() == 6 == sum(granted.total(w) for w in range(5))
    assert max(granted.total(w) for w in range(5)) == 2


def test_a_lost_workers_credits_go_to_the_others_and_the_batch_stays_whole():
    p, granted, _ = pipeline(batch=2)
    p.join(0, 1)
    p.deliver(0, empty_rollout(0, 0, 0))
    assert p.lose(1) == 2  # it was making (or about to make) two rollouts
    assert granted.total(0) >= 3  # they go to the worker left
    for seq in range(1, granted.total(0)):
        p.deliver(0, empty_rollout(0, seq, 0))
    batch, _ = p.next_batch(0)
    assert [(r.actor_id, r.seq) for r in batch] == [(0, 0), (0, 1)]
    assert p.lose(1) == 0  # lost once


def test_a_rollout_the_learner_would_take_over_the_lag_bound_is_dropped_not_consumed():
    p, granted, _ = pipeline(batch=1, lag=1)
    p.join(0, 1)
    p.deliver(0, empty_rollout(0, 0, 0))
    p.next_batch(0)
    p.deliver(0, empty_rollout(0, 1, 0))
    p.next_batch(1)
    p.deliver(1, empty_rollout(1, 0, 0))  # a straggler: version 0 at learner version 2
    p.deliver(0, empty_rollout(0, 2, 2))
    batch, stats = p.next_batch(2)
    assert [(r.actor_id, r.seq) for r in batch] == [(0, 2)] and stats["lag_max"] == 0
    assert p.dropped == 1 and (1, 0, 0) not in p.consumed.stamps()


def test_a_silent_worker_stops_holding_back_the_others():
    p, granted, clock = pipeline(batch=2, lag=1, suspect_factor=4.0, min_suspect_s=0.2)
    p.join(0, 1)
    for seq in range(2):
        clock.now += 0.1
        p.deliver(0, empty_rollout(0, seq, 0))
        p.deliver(1, empty_rollout(1, seq, 0))
    p.next_batch(0)
    before = granted.total(0)
    clock.now += 0.3  # worker 1 delivers nothing more (its node is gone, Ray does not know)
    p.deliver(0, empty_rollout(0, 2, 1))
    assert p.refresh() is not None and granted.total(0) == before  # not suspect yet
    clock.now += 0.2
    p.refresh()
    assert granted.total(0) == before + 1  # its credit no longer counts against the limit
    clock.now += 10
    p.deliver(0, empty_rollout(0, 3, 1))
    assert granted.total(1) == 3  # and it gets no more


def test_a_delivery_without_a_credit_is_a_broken_contract():
    p, granted, _ = pipeline()
    p.join(0)
    assert granted.total(0) == 4  # alone, it makes every rollout of the next two updates
    for seq in range(4):
        p.deliver(0, empty_rollout(0, seq, 0))
    with pytest.raises(RuntimeError, match="without a credit"):
        p.deliver(0, empty_rollout(0, 4, 0))
    with pytest.raises(RuntimeError, match="without a credit"):
        p.deliver(7, empty_rollout(7, 0, 0))


def test_a_stop_wakes_the_learner_waiting_for_rollouts():
    lifetime = Lifetime()
    p = ElasticPipeline(2, 1, lifetime)
    p.join(0)
    raised = []

    def wait() -> None:
        try:
            p.next_batch(0)
        except Stopped:
            raised.append(True)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    wait_until(lambda: thread.is_alive() and p._cond._waiters)  # waiting inside next_batch
    lifetime.stop()
    thread.join(5)
    assert raised == [True]


def test_the_learners_longest_wait_is_measured_and_reset():
    p, _, _ = pipeline(batch=1)
    p.join(0)
    timer = threading.Timer(0.2, lambda: p.deliver(0, empty_rollout(0, 0, 0)))
    timer.start()
    p.next_batch(0)
    assert p.take_longest_wait() >= 0.15
    assert p.take_longest_wait() == 0.0


def test_consumed_set_keeps_intervals_and_refuses_a_stamp_twice():
    consumed = ConsumedSet()
    for seq in (3, 1, 2, 0, 7, 5):
        consumed.add((4, 1, seq))
    consumed.add((4, 2, 0))
    assert consumed._runs[(4, 1)] == [[0, 4], [5, 6], [7, 8]]
    consumed.add((4, 1, 6))
    assert consumed._runs[(4, 1)] == [[0, 4], [5, 8]]
    for seq in (0, 3, 5, 7):
        with pytest.raises(RuntimeError, match="consumed twice"):
            consumed.add((4, 1, seq))
    assert consumed.count == 8
    assert consumed.stamps() == [(4, 1, s) for s in (0, 1, 2, 3, 5, 6, 7)] + [(4, 2, 0)]
