import threading
import time

import pytest

from podrace.control import (
    ComponentError,
    Control,
    HangDetected,
    Heartbeat,
    Lifetime,
    Stopped,
    Watchdog,
)

pytestmark = pytest.mark.timeout(30)


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


@pytest.mark.timeout(30)
def test_control_call_checks_the_stop_and_brackets_the_call_with_the_heartbeat():
    lifetime, beat = Lifetime(), Heartbeat("actor-0")
    control = Control(lifetime, beat, lambda metrics: None)
    inside = []
    assert (
        control.call(
            "env.step", 7, lambda x: inside.append(beat.overdue(time.monotonic() + 5, 1.0)) or x, 3
        )
        == 3
    )
    assert inside == ["env.step did not return within 1s (step 7)"]
    assert beat.overdue(time.monotonic() + 5, 1.0) is None  # idle again after the call

    def boom():
        raise ValueError("env broke")

    with pytest.raises(ValueError):
        control.call("env.reset", 8, boom)
    assert beat.overdue(time.monotonic() + 5, 1.0) is None  # also after a raising call
    lifetime.stop("test")
    with pytest.raises(Stopped):
        control.call("env.step", 9, inside.append, "never")
    assert inside[1:] == []


@pytest.mark.timeout(30)
def test_heartbeat_is_overdue_only_after_the_timeout():
    beat = Heartbeat("evaluator")
    beat.enter("evaluation env.step", 3)
    now = time.monotonic()
    assert beat.overdue(now, 60.0) is None
    assert (
        beat.overdue(now + 61.0, 60.0) == "evaluation env.step did not return within 60s (step 3)"
    )


@pytest.mark.timeout(30)
def test_watchdog_fails_the_run_naming_the_hung_component():
    lifetime = Lifetime()
    watchdog = Watchdog(lifetime, timeout_s=0.2)
    watchdog.heartbeat("actor-0")  # idle: never overdue
    watchdog.heartbeat("actor-1").enter("env.step", 42)
    thread = threading.Thread(target=watchdog.run, daemon=True)
    thread.start()
    thread.join(20)
    assert not thread.is_alive() and lifetime.stopping
    assert isinstance(lifetime.failure, ComponentError) and lifetime.failure.component == "actor-1"
    assert isinstance(lifetime.failure.error, HangDetected)
    assert "env.step did not return within 0.2s (step 42)" in str(lifetime.failure)


@pytest.mark.timeout(30)
def test_stop_runs_every_callback_once():
    lifetime = Lifetime()
    calls = []
    lifetime.on_stop(lambda: calls.append("a"))
    lifetime.on_stop(lambda: calls.append("b"))
    lifetime.stop("first")
    lifetime.stop("second")
    assert calls == ["a", "b"] and lifetime.stop_reason == "first"


@pytest.mark.timeout(10)
def test_heartbeat_allows_each_step_of_a_multi_step_call_the_timeout():
    """A fused rollout is one watched call of T env steps: the watchdog's per-step timeout
    must not fail a rollout whose steps are each well within it."""
    beat = Heartbeat("actor-0")
    beat.enter("env.rollout", 0, steps=512)
    now = time.monotonic()
    assert beat.overdue(now + 10.0, 2.0) is None  # 10s for 512 steps: 20ms a step
    assert "within 1024s" in beat.overdue(now + 2000.0, 2.0)
    beat.enter("env.step", 0)
    assert "within 2s" in beat.overdue(time.monotonic() + 3.0, 2.0)
