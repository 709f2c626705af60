"""Relay: N downstream workers cost one upstream read; closure and failures propagate."""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest

from podrace.sync.base import ChannelClosed, SnapshotMismatch
from podrace.sync.local import LocalPublisher
from podrace.sync.relay import Relay
from podrace.sync.shm import ShmPublisher
from tests.sync.workers import stamp_of, stamped_params
from tests.waiting import calling, wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("upstream_kind", ["local", "shm"])
def test_many_workers_cost_one_upstream_read(upstream_kind):
    upstream = (
        LocalPublisher(first_version=7)
        if upstream_kind == "local"
        else ShmPublisher(first_version=7)
    )
    downstream = LocalPublisher()
    relay = Relay(upstream.subscribe(name="node0"), downstream)
    devs = jax.devices()
    workers = [downstream.subscribe(devs[i % len(devs)]) for i in range(8)]
    for v in range(7, 12):
        upstream.publish(stamped_params(v, 32))
        for w in workers:
            snap = w.get(v, timeout=10)
            assert snap.version == v and stamp_of(snap.params) == v  # upstream numbering kept
    m = upstream.metrics()
    readers = [k for k in m if k.startswith("subscriber/") and k.endswith("/acked_version")]
    assert readers == ["subscriber/node0/acked_version"]
    assert relay.metrics()["relay/relay/last_version"] == 11
    assert downstream.metrics()["place/cpu1/seconds/count"] == 5  # one placement per version
    relay.close()
    upstream.close()


def test_upstream_close_closes_downstream():
    upstream = LocalPublisher()
    downstream = LocalPublisher()
    relay = Relay(upstream.subscribe(), downstream)
    worker = downstream.subscribe()
    upstream.publish(stamped_params(0, 8))
    worker.get(0, timeout=10)
    errors = []
    t = threading.Thread(target=lambda: _expect_closed(worker, errors))
    t.start()
    wait_until(lambda: calling(t, "get"))  # it waits for version 1
    upstream.close()
    t.join(10)
    relay.join(10)
    assert errors == ["closed"] and not relay.running


def _expect_closed(sub, errors):
    try:
        sub.get(1, timeout=30)
    except ChannelClosed:
        errors.append("closed")


def test_relay_failure_is_kept_and_reraised():
    upstream = LocalPublisher()
    downstream = ShmPublisher()
    relay = Relay(upstream.subscribe(), downstream)
    upstream.publish({"x": np.array([object()] * 3)})  # local carries Python objects, shm cannot
    with pytest.raises(SnapshotMismatch):
        relay.join(10)
    with pytest.raises(ChannelClosed):
        downstream.publish(stamped_params(2, 8))
    upstream.close()


def test_relay_as_push_target_for_in_process_fanout():
    """Inside one process a push target is enough: publish() hands the snapshot over."""
    upstream = LocalPublisher()
    downstream = LocalPublisher()
    upstream.add_push_target(lambda s: downstream.publish(s.params, version=s.version), "fanout")
    sub = downstream.subscribe()
    upstream.publish({"x": np.arange(3)})
    assert sub.get(0, timeout=10).version == 0
    upstream.close()
    downstream.close()


@pytest.mark.timeout(30)
def test_a_relay_that_stops_releases_its_source_subscriber():
    upstream, downstream = LocalPublisher(), LocalPublisher()
    source = upstream.subscribe(name="relay-source")
    relay = Relay(source, downstream, name="r")
    upstream.publish({"x": np.zeros(2)})
    wait_until(lambda: relay.last_version == 0, 10)
    downstream.close()  # e.g. the node's consumers shut down: the relay ends normally
    upstream.publish({"x": np.ones(2)})
    relay.join(10)
    assert relay.error is None and not relay.running
    with pytest.raises(ChannelClosed):
        source.poll()  # closed, not left subscribed upstream
    assert not any(k.startswith("subscriber/relay-source/") for k in upstream.metrics())
    upstream.close()
