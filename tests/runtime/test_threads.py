"""ThreadGroup: a thread's exception fails the run naming it; a stop is not a failure."""

import pytest

from podrace.control import Lifetime
from podrace.runtime.threads import ThreadGroup
from podrace.sync.base import ChannelClosed


def closed_channel():
    raise ChannelClosed("publisher is closed")


@pytest.mark.timeout(30)
def test_weights_channel_closed_without_a_stop_fails_the_run_naming_the_thread():
    lifetime = Lifetime()
    group = ThreadGroup(lifetime)
    group.spawn("actor-3", closed_channel, guard_transfers=False)
    assert group.join(10) == []
    assert lifetime.stopping and lifetime.failure is not None
    assert lifetime.failure.component == "actor-3"
    assert "weights channel closed" in str(lifetime.failure)


@pytest.mark.timeout(30)
def test_channel_closed_or_stopped_during_a_stop_is_not_a_failure():
    lifetime = Lifetime()
    lifetime.stop("finished")
    group = ThreadGroup(lifetime)
    group.spawn("actor-0", closed_channel, guard_transfers=False)
    group.spawn("actor-1", lifetime.check, guard_transfers=False)
    assert group.join(10) == []
    assert lifetime.failure is None


@pytest.mark.timeout(30)
def test_join_reports_threads_still_running_after_the_timeout():
    lifetime = Lifetime()
    group = ThreadGroup(lifetime)
    release = Lifetime()
    group.spawn("stuck", release.wait, guard_transfers=False)
    assert group.join(0.2) == ["stuck"]
    release.stop()
    assert group.join(10) == []



@pytest.mark.timeout(30)
def test_threads_run_under_the_disallow_transfer_guard_unless_told_otherwise():
    import jax.numpy as jnp
    import numpy as np

    def implicit_transfer():
        jnp.ones(2) + np.ones(2)  # a NumPy operand moved to the device implicitly

    lifetime = Lifetime()
    group = ThreadGroup(lifetime)
    group.spawn("learner", implicit_transfer)
    assert group.join(20) == []
    assert lifetime.failure is not None and lifetime.failure.component == "learner"
    assert "transfer" in str(lifetime.failure).lower()

    lifetime = Lifetime()
    group = ThreadGroup(lifetime)
    group.spawn("watchdog", implicit_transfer, guard_transfers=False)
    assert group.join(20) == [] and lifetime.failure is None
