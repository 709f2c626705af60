"""The inference server: batches reassemble exactly, versions and the lag bound per step,
restarts and failures of env workers.

Each test runs a server with real env worker processes (`tests.inference.fake_envs`: an env
that raises on any action but the fake policy's choice for its own observation) and a
stand-in learner (`tests.inference.harness`)."""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest

from podrace.control import ComponentError
from podrace.envs.workers import EnvWorkerDied, EnvWorkerError
from podrace.inference.batching import ParamsTimeout, request_buckets
from tests.inference import fake_envs
from tests.inference.harness import Served, check_rollout
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(300)


def consumed_stamps(served: Served) -> list[tuple[int, int]]:
    return [(r.actor_id, r.seq) for batch in served.consumed for r in batch]


@pytest.mark.slow
@pytest.mark.parametrize(
    "settings",
    [
        {},  # greedy: whatever is ready
        {"max_wait_s": 0.005},
        {"max_batch": 2},  # one worker's envs per call
        {"fixed_order": True},
    ],
    ids=["greedy", "max-wait", "max-batch", "fixed-order"],
)
def test_every_worker_gets_the_actions_for_its_own_observations(settings):
    """Two actors of two workers each, half of the workers slow: every action reaches the
    worker whose observation chose it (the env raises otherwise), and each rollout holds
    each env's own steps in order."""
    factory = fake_envs.CheckedEnvs(slow_s=0.003)
    with Served(actors=2, parts=2, envs=4, length=6, rollouts=4, factory=factory, **settings) as s:
        s.start().wait()
        assert consumed_stamps(s) == [(a, q) for q in range(4) for a in range(2)]
        for sink in s.sinks:
            for rollout in sink.rollouts:
                check_rollout(rollout, 6)
                n = np.asarray(rollout.trajectory.obs)[..., 1]
                valid = np.asarray(rollout.trajectory.valid)
                # The step counter of each env goes on by one, or restarts after a
                # terminal step (whose next step is the autoreset, marked invalid).
                following = n[1:] == n[:-1] + 1
                reset = (n[1:] == 0) & ~valid[1:]
                assert (following | reset).all()
    if settings.get("max_batch") == 2:
        assert s.server.most_requests == 1


@pytest.mark.slow
def test_a_worker_killed_mid_request_is_restarted_and_its_actors_rollout_retaken(tmp_path, caplog):
    """The first worker to reach its 7th step SIGKILLs itself while stepping: it is
    restarted, the rollouts its actor had open are discarded (never consumed), and every
    rollout consumed is whole, each (actor, seq) exactly once. The restart is one line."""
    factory = fake_envs.CheckedEnvs(die_once=str(tmp_path / "died"), die_at=7)
    with Served(actors=2, parts=2, envs=4, length=4, rollouts=5, factory=factory) as s:
        s.start().wait()
        assert (tmp_path / "died").exists()
        assert s.server.restarts == 1
        assert consumed_stamps(s) == [(a, q) for q in range(5) for a in range(2)]
        for batch in s.consumed:
            for rollout in batch:
                check_rollout(rollout, 4)
        assert sum(a.restarts for a in s.actors) == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "podrace.inference.server"]
    assert len(lines) == 1 and lines[0].startswith("env worker a"), lines
    assert lines[0].endswith(
        "was killed by SIGKILL; restarting it with fresh seeds, restart 1 of 3 "
        "(--env.worker-restarts, per worker)"
    ), lines


def test_a_worker_that_dies_beyond_its_restarts_fails_the_run_naming_it(tmp_path):
    factory = fake_envs.CheckedEnvs(die_once=str(tmp_path / "died"), die_at=3)
    with Served(actors=1, parts=2, envs=4, factory=factory, worker_restarts=0) as s:
        with pytest.raises(ComponentError) as raised:
            s.start().wait()
    error = raised.value.error
    assert isinstance(error, EnvWorkerDied)
    message = str(error)
    assert "\n" not in message
    assert "was killed by SIGKILL" in message and "env worker a0.w" in message
    assert "env.worker_restarts 0" in message


def test_the_restart_limit_is_each_workers_own_and_its_message_counts_in_words():
    """Every worker dies at its 3rd step, restarts included: with one restart allowed, the
    run fails when a worker dies after its own restart, and says so in plain words."""
    factory = fake_envs.CheckedEnvs(die_every=True, die_at=3)
    with Served(actors=1, parts=2, envs=4, factory=factory, worker_restarts=1) as s:
        with pytest.raises(ComponentError) as raised:
            s.start().wait()
    message = str(raised.value.error)
    assert message.endswith(
        "restarted 1 time already, the limit for each worker (env.worker_restarts 1)"
    ), message


def test_an_env_that_raises_fails_the_run_with_one_line_naming_its_worker():
    with Served(actors=1, parts=2, envs=4) as s:
        s.server.serve_fn = _wrong_rows(s.server.serve_fn)
        with pytest.raises(ComponentError) as raised:
            s.start().wait()
    error = raised.value.error
    assert isinstance(error, EnvWorkerError)
    assert "\n" not in str(error)
    assert str(error).startswith("a0.w") and "env.step raised AssertionError" in str(error)


def _wrong_rows(serve_fn):
    """The policy call with its answers rotated by one row: the envs must notice."""

    def serve(params, obs, requests):
        actions, logprobs, values = serve_fn(params, obs, requests)
        return np.roll(jax.device_get(actions), 1), logprobs, values

    return serve


def test_a_push_mid_rollout_shows_in_the_per_step_versions():
    """Lag bound 1: version 1 is published during the third policy call of rollout 0 and
    reaches the server before the call returns; the steps served after it carry version 1
    (their values say so too), those before version 0, and the rollout is stamped with the
    oldest."""
    holder: list[Served] = []

    def publish_during_third_call(serve_fn):
        def serve(params, obs, requests):
            s = holder[0]
            if s.server.batches == 2:
                s.publisher.publish(fake_envs.params(1))
                wait_until(lambda: s.server._incoming is not None, 30)
            return serve_fn(params, obs, requests)

        return serve

    def learner():
        s = holder[0]
        for version in range(1, s.rollouts_each + 1):
            batch, _ = s.pipeline.next_batch(version)
            s.consumed.append(batch)
            s.publisher.publish(fake_envs.params(version + 1))
        s.finished.set()

    with Served(actors=1, parts=2, envs=4, length=12, rollouts=2, learner=learner) as s:
        holder.append(s)
        s.server.serve_fn = publish_during_third_call(s.server.serve_fn)
        s.start().wait()
        first = s.sinks[0].rollouts[0]
        check_rollout(first, 12)
        versions = first.behaviour_versions
        assert versions.min() == 0 and versions.max() == 1
        # Per env, versions never go back in time within the rollout.
        assert (np.diff(versions, axis=0) >= 0).all()
        assert first.policy_version == 0
        assert s.sinks[0].rollouts[1].policy_version >= 1


def test_a_rollout_beyond_the_lag_bound_waits_for_params():
    """Lag bound 0 and a learner that publishes late: rollout 1 waits (no step of it is
    served with version 0), then goes on with version 1."""
    release = threading.Event()

    def learner():
        s = holder[0]
        for version in range(s.rollouts_each):
            batch, _ = s.pipeline.next_batch(version)
            s.consumed.append(batch)
            if version == 0:
                release.wait(30)
            s.publisher.publish(fake_envs.params(version + 1))
        s.finished.set()

    holder = []
    with Served(actors=1, parts=2, envs=4, length=3, rollouts=3, lag=0, learner=learner) as s:
        holder.append(s)
        s.start()
        wait_until(lambda: len(s.sinks[0].rollouts) == 1, 30)
        served = s.server.batches
        wait_until(lambda: all(p.blocked_since is not None for p in s.actors[0].parts), 30)
        assert s.server.batches == served  # nothing served for rollout 1 meanwhile
        release.set()
        s.wait()
        for seq, rollout in enumerate(s.sinks[0].rollouts):
            check_rollout(rollout, 3)
            assert (rollout.behaviour_versions == seq).all()


@pytest.mark.slow
def test_a_rollout_beyond_the_lag_bound_fails_after_the_params_timeout():
    def learner():  # never publishes a newer version; returns once the run stops
        holder[0].lifetime.wait()

    holder = []
    with Served(
        actors=1, parts=2, envs=4, length=3, rollouts=3, lag=0, learner=learner,
        params_timeout_s=0.3,
    ) as s:  # fmt: skip
        holder.append(s)
        with pytest.raises(ComponentError) as raised:
            s.start().wait()
    error = raised.value.error
    assert isinstance(error, ParamsTimeout)
    assert "\n" not in str(error)
    assert "rollout 1 waited" in str(error) and "params version >= 1 (newest 0" in str(error)


def test_a_stop_while_workers_step_ends_the_run_and_each_worker_on_its_close():
    """A stop while workers step ends every thread of the run, and each worker, told to
    close while its steps are under way, exits by itself (code 0): nothing waits for a
    kill. The close grace is a hang bound here, far above an exit on a loaded machine."""
    factory = fake_envs.CheckedEnvs(slow_s=0.05)
    s = Served(actors=1, parts=2, envs=4, rollouts=1000, factory=factory)
    try:
        s.start()
        wait_until(lambda: s.server.batches >= 2, 30)
        s.lifetime.stop("ctrl-c")
        assert s.group.join(60.0) == []
        for worker in s.workers:
            worker.close(grace=60.0)
        assert [w.process.returncode for w in s.workers] == [0, 0]
    finally:
        s.close()
    assert all(not w.alive for w in s.workers)


def test_a_stop_during_a_slow_batched_call_ends_the_server_after_that_call():
    """The policy call is held until the test releases it; a stop that comes during it ends
    the server as soon as the call returns: no further policy call after it."""
    entered, release = threading.Event(), threading.Event()
    calls = []
    s = Served(actors=1, parts=2, envs=4, rollouts=1000)
    fast = s.server.serve_fn

    def held(*args):
        calls.append(s.lifetime.stopping)
        entered.set()
        release.wait(60)
        return fast(*args)

    try:
        s.server.serve_fn = held
        s.start()
        wait_until(entered.is_set, 30)
        batches = s.server.batches
        s.lifetime.stop("ctrl-c")
        release.set()
        assert s.group.join(60.0) == []
        assert calls.count(True) == 0  # no call began once the run stopped
        assert s.server.batches == batches + 1  # the call under way finished, then it ended
    finally:
        release.set()
        s.close()


def test_a_worker_that_dies_once_the_run_stops_is_the_stop_not_a_failure():
    """The run closes workers under the server once it stops: a death seen then neither
    restarts the worker nor fails the (finished) run."""
    from podrace.control import Stopped

    s = Served(actors=1, parts=2, envs=4, worker_restarts=0)
    try:
        s.workers[0].kill()
        s.workers[0].process.wait(10)
        s.lifetime.stop("finished")
        with pytest.raises(Stopped):
            s.server.run()
        assert s.workers[0].restarts == 0 and s.lifetime.failure is None
    finally:
        s.close()


def test_a_worker_step_longer_than_the_watchdog_allows_fails_the_run_naming_it():
    from podrace.control import HangDetected

    # Every step takes 600 s, far beyond the watchdog. The watchdog starts once each part
    # has entered its first step: the resets before, however slow on a loaded machine, are
    # not what it catches.
    factory = fake_envs.CheckedEnvs(slow_s=600.0, slow_all=True)
    with Served(actors=1, parts=2, envs=4, factory=factory, watchdog_s=1.5) as s:
        entered = {}
        for part in s.server.parts:

            def enter(what, step, *more, part=part, real=part.heartbeat.enter):
                entered[part.index] = what
                real(what, step, *more)

            part.heartbeat.enter = enter
        s.start(watchdog=False)
        wait_until(lambda: entered == {0: "env.step", 1: "env.step"}, 60)
        s.start_watchdog()
        with pytest.raises(ComponentError) as raised:
            s.wait()
    failure = raised.value
    assert isinstance(failure.error, HangDetected)
    assert failure.component.startswith("a0.w")
    assert "env.step did not return within 1.5s" in str(failure.error)


def test_request_buckets():
    assert request_buckets(6, 6, fixed=False) == [1, 2, 4, 6]
    assert request_buckets(6, 6, fixed=True) == [6]
    assert request_buckets(8, 3, fixed=False) == [1, 2, 3]
