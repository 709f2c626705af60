"""ThreadGroup: a thread's exception fails the run naming it; a stop is not a failure.
close_envs: a user's env.close that raises or blocks neither propagates nor keeps us."""

import logging
import threading

import pytest

from podrace.control import Lifetime
from podrace.envs.closing import close_envs
from podrace.runtime.threads.group import ThreadGroup
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


class Env:
    def __init__(self, close=None):
        self.closed, self._close = False, close

    def close(self):
        if self._close is not None:
            self._close()
        self.closed = True


@pytest.mark.timeout(30)
def test_close_envs_logs_a_raising_close_and_still_closes_the_others(caplog):
    def explode():
        raise RuntimeError("user close() failed")

    bad, good = Env(explode), Env()
    with caplog.at_level(logging.WARNING, logger="podrace.runtime.threads.group"):
        assert close_envs([("actor-0", bad), ("evaluator", good)]) == []
    assert good.closed and not bad.closed
    assert "actor-0: env.close() raised RuntimeError: user close() failed" in caplog.text


@pytest.mark.timeout(30)
def test_close_envs_leaves_a_blocking_close_behind_and_names_it():
    release = threading.Event()
    blocking, good = Env(release.wait), Env()  # blocks until the test releases it
    # Returning at all, with the blocking close still inside release.wait(), is the check.
    assert close_envs([("actor-1", blocking), ("actor-2", good)], timeout=0.3) == [
        "actor-1 env.close"
    ]
    assert good.closed
    release.set()
