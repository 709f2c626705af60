import threading

import pytest

from podrace.control import ComponentError, Lifetime, Stopped


def test_first_failure_wins_and_stops():
    lifetime = Lifetime()
    lifetime.fail("actor-0", ValueError("boom"))
    lifetime.fail("learner", RuntimeError("echo"))
    assert lifetime.stopping
    assert isinstance(lifetime.failure, ComponentError)
    assert lifetime.failure.component == "actor-0"
    assert "actor-0 failed: ValueError: boom" in str(lifetime.failure)
    with pytest.raises(Stopped):
        lifetime.check()


def test_on_stop_after_stop_runs_immediately():
    lifetime = Lifetime()
    lifetime.stop()
    called = threading.Event()
    lifetime.on_stop(called.set)
    assert called.is_set()
