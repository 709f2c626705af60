"""Stops and hangs at awkward moments: the error or the stop reaches the caller quickly."""

import json
import threading
import time

import pytest

from podrace.checkpoints.files import Checkpointer
from podrace.control import ComponentError, HangDetected, Lifetime
from podrace.runtime.faults import STUCK, FaultPlan
from podrace.runtime.run import prepare
from tests.helpers.configs import small
from tests.threads import podrace_threads
from tests.waiting import wait_until


def last_line(run):
    return json.loads((run.run_dir / "metrics.jsonl").read_text().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "component,call", [("actor-1", "env.reset"), ("evaluator", "evaluation env.reset")]
)
def test_hang_in_reset_is_caught_by_the_watchdog(tmp_path, component, call):
    run = prepare(
        small(tmp_path, **{"safety.watchdog_s": 2.0}), faults=FaultPlan(reset_hang=component)
    )
    with pytest.raises(ComponentError) as exc:
        run.run()
    assert exc.value.component == component and isinstance(exc.value.error, HangDetected)
    assert f"{call} did not return within 2s (step 0)" in str(exc.value)
    assert last_line(run)["final"] == 1
    assert not podrace_threads()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_non_cooperative_hang_in_step_reaches_the_caller_within_watchdog_plus_2s(tmp_path):
    watchdog_s = 2.0
    run = prepare(
        small(tmp_path, total_steps=10**7, **{"safety.watchdog_s": watchdog_s}),
        faults=FaultPlan(env_stuck=(0, 25)),
    )
    try:
        with pytest.raises(ComponentError) as exc:
            run.run()
        raised = time.monotonic()
        stuck_env = run.actors[0].env
        elapsed = raised - stuck_env.stuck_since
        print(
            f"error reached the caller {elapsed:.2f}s after the hang began (watchdog {watchdog_s}s)"
        )
        assert elapsed <= watchdog_s + 2 + 2  # target watchdog + 2 s; slack for a loaded machine
        assert (
            exc.value.component == "actor-0"
            and "env.step did not return within 2s (step 25)" in str(exc.value)
        )
        assert run.stuck == ["actor-0"]
        assert not stuck_env.closed  # closing an env under a running call could crash
        assert last_line(run)["final"] == 1
    finally:
        STUCK.set()  # free the thread the run left behind
        for thread in podrace_threads():
            thread.join(10)
        STUCK.clear()
    assert not podrace_threads()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_stop_mid_rollout_returns_within_seconds(tmp_path):
    # One rollout takes 128 steps x 0.05 s = 6.4 s: a stop seen only between rollouts is late.
    lifetime = Lifetime()
    run = prepare(
        small(tmp_path, total_steps=10**7, rollout_length=128),
        lifetime,
        faults=FaultPlan(slow={"env_step": 0.05}),
    )
    done = threading.Event()
    worker = threading.Thread(target=lambda: (run.run(), done.set()), daemon=True)
    worker.start()
    wait_until(lambda: run.actors[0].env_steps >= 5, 60)
    stopped = time.monotonic()
    lifetime.stop("test")
    assert done.wait(30)
    elapsed = time.monotonic() - stopped
    print(f"run returned {elapsed:.2f}s after the stop")
    assert elapsed <= 4  # target <= 2 s; slack for a loaded machine
    assert run.learner.version == 0 and not run.run_dir.exists()  # nothing trained: nothing kept
    assert not podrace_threads()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_metrics_sink_failure_fails_the_run_as_logger(tmp_path):
    run = prepare(small(tmp_path, total_steps=10**7), faults=FaultPlan(sink_raise_at=2))
    with pytest.raises(
        ComponentError, match=r"^logger failed: OSError: .*No space left on device"
    ) as exc:
        run.run()
    assert exc.value.component == "logger"
    assert last_line(run)["final"] == 1  # the other sinks still got the last line
    assert not podrace_threads()


class RaisingClose:
    """An env whose close raises (or blocks until `release` is set), as user code may."""

    def __init__(self, env, release=None, checkpoints=None):
        self.env, self.release, self.checkpoints = env, release, checkpoints
        self.checkpoint_at_close = None

    def __getattr__(self, name):
        return getattr(self.env, name)

    def close(self):
        if self.checkpoints is not None:
            self.checkpoint_at_close = self.checkpoints.latest
        self.env.close()
        if self.release is not None:
            self.release.wait()
        else:
            raise RuntimeError("user close() failed")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_env_close_that_raises_keeps_the_result_and_the_final_checkpoint(
    tmp_path, caplog, monkeypatch
):
    # Not waiting for the final save before the final line: the order of close and save is
    # then what the test sees (with the wait, a quick save was done before either).
    monkeypatch.setattr("podrace.runtime.skeleton.FINAL_SAVE_WAIT_S", 0.0)
    # The last save starts before the final evaluation: a slow write is still going on
    # when the envs are closed, so the order is visible.
    write = Checkpointer._write

    def slow_write(self, *args, **kwargs):
        time.sleep(3.0)
        return write(self, *args, **kwargs)

    monkeypatch.setattr(Checkpointer, "_write", slow_write)
    run = prepare(small(tmp_path))
    for actor in run.actors:
        actor.env = RaisingClose(actor.env, checkpoints=run.checkpoints)
    run.evaluator.env = RaisingClose(run.evaluator.env)
    result = run.run()
    assert result.checkpoint == run.cfg.num_updates
    # user code runs again only once the last checkpoint is complete
    assert [actor.env.checkpoint_at_close for actor in run.actors] == [run.cfg.num_updates] * 2
    assert (run.run_dir / "checkpoints" / str(result.checkpoint)).is_dir()
    assert last_line(run)["final"] == 1
    assert "actor-0: env.close() raised RuntimeError: user close() failed" in caplog.text
    assert "evaluator: env.close() raised RuntimeError" in caplog.text


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_env_close_that_blocks_is_left_behind_after_the_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr("podrace.envs.closing.ENV_CLOSE_GRACE_S", 0.5)
    release = threading.Event()
    run = prepare(small(tmp_path))
    run.actors[1].env = RaisingClose(run.actors[1].env, release)
    try:
        with pytest.raises(ComponentError) as exc:  # a finished run whose threads did not all stop
            run.run()
        assert "env.close() did not return within 0.5s: actor-1" in str(exc.value)
        assert run.stuck == ["actor-1 env.close"]
        assert (run.run_dir / "checkpoints" / str(run.cfg.num_updates)).is_dir()
    finally:
        release.set()


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "failing_step, evaluator_built",
    [("build_evaluator", False), ("warm_up_learner", True)],
    ids=["evaluator-env", "update-compile"],
)
def test_envs_built_before_a_failed_preparation_are_closed(
    tmp_path, monkeypatch, failing_step, evaluator_built
):
    import podrace.runtime.skeleton as skeleton
    import podrace.runtime.threads.actors as threads

    built = []
    build_actor = threads.build_actor

    def recording(*args, **kwargs):
        actor = build_actor(*args, **kwargs)
        built.append(actor.env)
        return actor

    def failing(*args, **kwargs):
        raise RuntimeError(f"{failing_step} failed")

    monkeypatch.setattr(threads, "build_actor", recording)
    monkeypatch.setattr(skeleton, failing_step, failing)
    closed = []
    monkeypatch.setattr(
        skeleton, "close_envs", lambda envs: closed.extend(env for _, env in envs) or []
    )
    with pytest.raises(RuntimeError, match=f"{failing_step} failed"):
        prepare(small(tmp_path))
    # every env built is closed: both actors' and, once built, the evaluator's
    assert len(built) == 2 and closed[:2] == built
    assert len(closed) == 2 + evaluator_built
    assert list(tmp_path.iterdir()) == []  # and no run directory is left
