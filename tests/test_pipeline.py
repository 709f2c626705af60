import threading

import numpy as np
import pytest

from podrace.control import Lifetime, Stopped
from podrace.pipeline import BoundedQueue, LagExceeded, Pipeline, PlacingSink
from podrace.types import Rollout
from tests.helpers.rollouts import empty_rollout
from tests.waiting import calling, wait_until

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def pipe() -> Pipeline:
    """A pipeline of one actor's rollouts, one at a time, lag bound 1."""
    return Pipeline(num_actors=1, capacity=1, max_policy_lag=1, lifetime=Lifetime())


def test_queue_blocks_when_full_and_times_the_wait():
    q = BoundedQueue(1, Lifetime())
    q.put("a")
    taker = threading.Timer(0.2, q.get)
    taker.start()
    waited = q.put("b")
    assert waited >= 0.15
    assert q.get()[0] == "b"


def test_stop_wakes_blocked_put_and_get():
    lifetime = Lifetime()
    full, empty = BoundedQueue(1, lifetime), BoundedQueue(1, lifetime)
    full.put(1)
    errors = []

    def blocked(fn):
        try:
            fn()
        except Stopped:
            errors.append(fn)

    threads = [
        threading.Thread(target=blocked, args=(f,), daemon=True)
        for f in (lambda: full.put(2), empty.get)
    ]
    for t in threads:
        t.start()
    wait_until(lambda: calling(threads[0], "put") and calling(threads[1], "get"))  # blocked
    lifetime.stop()
    for t in threads:
        t.join(2)
    assert not any(t.is_alive() for t in threads)
    assert len(errors) == 2


def test_pipeline_takes_actors_in_order_and_measures_lag():
    pipe = Pipeline(num_actors=2, capacity=2, max_policy_lag=1, lifetime=Lifetime())
    pipe.put(empty_rollout(1, 0, 0))
    pipe.put(empty_rollout(0, 0, 0))
    batch, stats = pipe.next_batch(learner_version=1)
    assert [r.actor_id for r in batch] == [0, 1]
    assert stats["lag_max"] == 1 and stats["lag_min"] == 1


def test_pipeline_rejects_rollout_over_lag_bound(pipe):
    pipe.put(empty_rollout(0, 0, 0))
    with pytest.raises(LagExceeded, match="lag 2, bound 1"):
        pipe.next_batch(learner_version=2)


def test_pipeline_rejects_out_of_sequence_rollout(pipe):
    pipe.put(empty_rollout(0, 1, 0))
    with pytest.raises(RuntimeError, match="expected 0"):
        pipe.next_batch(learner_version=0)


@pytest.mark.timeout(30)
def test_pipeline_rejects_rollout_newer_than_the_learner(pipe):
    """A behaviour policy newer than the learner's params (negative lag) is a broken contract."""
    pipe.put(empty_rollout(0, 0, 3))
    with pytest.raises(LagExceeded, match="lag -1"):
        pipe.next_batch(learner_version=2)


@pytest.mark.timeout(30)
def test_placing_sink_places_then_queues_and_times_it(pipe):
    sink = PlacingSink(pipe, place=lambda traj: ("placed", traj))
    r = Rollout(
        0,
        0,
        0,
        trajectory="raw",
        episode_returns=np.zeros(0),
        episode_lengths=np.zeros(0),
        timings={},
    )
    assert sink.put(r) >= 0
    (got,), _ = pipe.next_batch(learner_version=0)
    assert got.trajectory == ("placed", "raw") and "to_learner" in r.timings


def test_pipeline_resumes_at_first_seq():
    """After a checkpoint, actors continue at `first_seq`; a rollout from before it is stale."""
    pipe = Pipeline(num_actors=1, capacity=2, max_policy_lag=1, lifetime=Lifetime(), first_seq=7)
    pipe.put(empty_rollout(0, 7, 5))
    pipe.put(empty_rollout(0, 9, 5))
    (got,), _ = pipe.next_batch(learner_version=5)
    assert got.seq == 7
    with pytest.raises(RuntimeError, match="actor 0 sent rollout 9, expected 8"):
        pipe.next_batch(learner_version=5)


def test_lag_statistics_cover_every_actor():
    pipe = Pipeline(num_actors=3, capacity=1, max_policy_lag=2, lifetime=Lifetime())
    for actor_id, version in enumerate([4, 2, 3]):
        pipe.put(empty_rollout(actor_id, 0, version))
    _, stats = pipe.next_batch(learner_version=4)
    assert stats["lag_min"] == 0 and stats["lag_max"] == 2 and stats["lag_mean"] == 1.0
