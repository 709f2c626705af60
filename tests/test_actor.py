"""The actor loop alone, with fakes: a scripted env, a fake params source, a list sink."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podrace.actor import Actor, ActorSettings, EnvError, PolicyFns
from podrace.control import Control, Heartbeat, Lifetime, Stopped
from podrace.sync.base import ChannelClosed
from tests.helpers.actors import FakeParams, ListSink, ScriptedEnv

B = ScriptedEnv.num_envs


def fake_policy() -> PolicyFns:
    def step(params, obs, key):
        key = key + 1  # raw key data in and out, as make_policy_fns' step takes it
        zeros = jnp.zeros(obs.shape[0])
        return zeros.astype(jnp.int32), zeros + params["w"], zeros, key

    def stack(*fields):
        return tuple(jnp.stack(f) for f in fields)

    return PolicyFns(
        step=jax.jit(step),
        value=jax.jit(lambda p, obs: jnp.zeros(obs.shape[0])),
        stack=jax.jit(stack),
        device=jax.devices()[0],
    )


def make_actor(env, T=4, rollouts=3, lag=1, first_seq=0, params=None, lifetime=None):
    settings = ActorSettings(
        actor_id=0,
        rollout_length=T,
        num_rollouts=rollouts,
        max_policy_lag=lag,
        key=jax.random.PRNGKey(0),
        first_seq=first_seq,
    )
    recorded = []
    control = Control(lifetime or Lifetime(), Heartbeat("actor-0"), recorded.append)
    sink = ListSink()
    actor = Actor(settings, env, fake_policy(), params or FakeParams(), sink, control)
    return actor, sink, recorded


@pytest.mark.timeout(60)
def test_autoreset_steps_are_invalid_exactly():
    # Episode ends at 1-based steps; the step after each
    # end (0-based row == the 1-based end step) is the autoreset step, and only it is invalid.
    ends = [{3: "terminated", 8: "truncated"}, {1: "truncated", 6: "terminated", 12: "terminated"}]
    actor, sink, _ = make_actor(ScriptedEnv(ends), T=4, rollouts=3)
    actor.run()
    valid = np.concatenate([np.asarray(r.trajectory.valid) for r in sink.rollouts])  # [12, B]
    expected = np.ones((12, B), bool)
    for b, script in enumerate(ends):
        for step in script:
            if step < 12:
                expected[step, b] = False
    np.testing.assert_array_equal(valid, expected)
    terminated = np.concatenate([np.asarray(r.trajectory.terminated) for r in sink.rollouts])
    truncated = np.concatenate([np.asarray(r.trajectory.truncated) for r in sink.rollouts])
    assert terminated[2, 0] and truncated[7, 0] and truncated[0, 1] and terminated[11, 1]
    assert terminated.sum() + truncated.sum() == 5
    # The reset step after an end at the last step of a rollout is invalid in the next one.
    assert not sink.rollouts[2].trajectory.valid[0, 0]


@pytest.mark.timeout(60)
def test_rollouts_are_stamped_and_wait_for_the_lag_bound():
    params = FakeParams(version=0)
    actor, sink, recorded = make_actor(
        ScriptedEnv([{}, {}]), rollouts=3, lag=1, first_seq=5, params=params
    )
    actor.run()
    assert [r.seq for r in sink.rollouts] == [5, 6, 7]
    assert [r.actor_id for r in sink.rollouts] == [0, 0, 0]
    # Rollout 5 needs version >= 4, and the fake params source had only 0: a blocking get.
    assert params.gets[0] == 4
    assert all(r.policy_version >= r.seq - 1 for r in sink.rollouts)
    assert sink.rollouts[0].trajectory.obs.shape == (4, B, 1)
    assert any("actor/env_step" in line for line in recorded)


@pytest.mark.timeout(60)
def test_stop_is_seen_before_the_next_env_step():
    lifetime = Lifetime()

    def stop_at(step):
        if step == 2:
            lifetime.stop("test")

    env = ScriptedEnv([{}, {}], on_step=stop_at)
    actor, sink, _ = make_actor(env, T=100, rollouts=1, lifetime=lifetime)
    with pytest.raises(Stopped):
        actor.run()
    assert env.steps == 2 and not sink.rollouts


@pytest.mark.timeout(60)
def test_env_errors_say_which_call_step_and_rollout():
    def boom(step):
        if step == 6:
            raise ValueError("kaput")

    actor, _, _ = make_actor(ScriptedEnv([{}, {}], on_step=boom), T=4)
    with pytest.raises(
        EnvError, match=r"env.step raised at step 6 \(rollout 1\): ValueError: kaput"
    ):
        actor.run()

    def bad_reset():
        raise OSError("no display")

    actor, _, _ = make_actor(ScriptedEnv([{}, {}], on_reset=bad_reset))
    with pytest.raises(EnvError, match="env.reset raised at step 0: OSError: no display"):
        actor.run()


@pytest.mark.timeout(60)
def test_reset_is_watched_by_the_heartbeat():
    seen = []
    actor = None

    def in_reset():
        seen.append(actor.control.heartbeat.overdue(time.monotonic() + 10, 1.0))

    actor, _, _ = make_actor(ScriptedEnv([{}, {}], on_reset=in_reset), rollouts=1)
    actor.run()
    assert seen == ["env.reset did not return within 1s (step 0)"]


@pytest.mark.timeout(60)
def test_closed_params_channel_is_not_swallowed():
    params = FakeParams()
    actor, sink, _ = make_actor(
        ScriptedEnv([{}, {}], on_step=lambda s: s == 5 and setattr(params, "closed", True)),
        rollouts=5,
        params=params,
    )
    with pytest.raises(ChannelClosed):
        actor.run()
    assert len(sink.rollouts) == 2


@pytest.mark.timeout(60)
def test_sampling_key_is_a_pure_function_of_the_raw_key():
    from podrace.actor import SAMPLING_PRNG, sampling_key

    raw = jax.random.PRNGKey(7)
    a, b = sampling_key(raw), sampling_key(jax.random.key(7))  # raw and typed threefry keys agree
    assert a.dtype == np.uint32 and a.shape == (
        4,
    )  # raw data: jitted calls take it on JAX's C++ path
    np.testing.assert_array_equal(a, b)
    other = sampling_key(jax.random.PRNGKey(8))
    assert not np.array_equal(a, other)
    keys = [jax.random.wrap_key_data(k, impl=SAMPLING_PRNG) for k in (a, sampling_key(raw))]
    draws = [np.asarray(jax.random.categorical(k, jnp.zeros((64, 2)))) for k in keys]
    np.testing.assert_array_equal(*draws)


class NewerEachPoll(FakeParams):
    """A learner that publishes one new version between every two polls."""

    def poll(self):
        self.version += 1
        return super().poll()


@pytest.mark.timeout(60)
def test_actor_acts_with_the_newest_params_it_polled():
    params = NewerEachPoll(version=0)
    actor, sink, _ = make_actor(ScriptedEnv([{}, {}]), rollouts=3, lag=1, params=params)
    actor.run()
    # Rollout 0 gets version 0 (blocking get); each later one polls a newer version and uses it.
    assert [r.policy_version for r in sink.rollouts] == [0, 1, 2]


class TimedSink(ListSink):
    def put(self, rollout):
        super().put(rollout)
        return 0.25


@pytest.mark.timeout(60)
def test_every_rollout_reports_its_timings_with_the_queue_wait():
    actor, _, recorded = make_actor(ScriptedEnv([{}, {}]), rollouts=2)
    actor.out = sink = TimedSink()
    actor.run()
    per_rollout = [line for line in recorded if "actor/rollout" in line]
    assert len(per_rollout) == 2
    for line in per_rollout:
        assert line["actor/queue_put_wait"] == 0.25
        assert {"actor/inference", "actor/device_to_host", "actor/env_step"} <= set(line)
    assert all(r.timings["queue_put_wait"] == 0.25 for r in sink.rollouts)


@pytest.mark.timeout(60)
def test_episode_returns_and_lengths_count_truncated_and_terminated_episodes():
    ends = [{3: "terminated", 8: "truncated"}, {1: "truncated", 6: "terminated"}]
    actor, sink, _ = make_actor(ScriptedEnv(ends), T=4, rollouts=3)
    actor.run()
    returns = sorted(float(x) for r in sink.rollouts for x in r.episode_returns)
    lengths = sorted(int(x) for r in sink.rollouts for x in r.episode_lengths)
    assert returns == [1.0, 3.0, 6.0, 8.0]
    assert lengths == [1, 3, 6, 8]


@pytest.mark.timeout(60)
def test_last_value_bootstraps_from_the_observation_after_the_rollout():
    # The scripted env's obs after step k is k; a value function that reads the obs shows
    # which observation was bootstrapped from.
    env = ScriptedEnv([{}, {}])
    actor, sink, _ = make_actor(env, T=4, rollouts=2)
    actor.policy = PolicyFns(
        step=actor.policy.step,
        value=jax.jit(lambda p, obs: obs[:, 0] * 10.0),
        stack=actor.policy.stack,
        device=actor.policy.device,
    )
    actor.run()
    np.testing.assert_array_equal(
        np.asarray(sink.rollouts[0].trajectory.last_obs)[:, 0], [4.0, 4.0]
    )
    np.testing.assert_array_equal(np.asarray(sink.rollouts[0].trajectory.last_value), [40.0, 40.0])
    np.testing.assert_array_equal(np.asarray(sink.rollouts[1].trajectory.last_value), [80.0, 80.0])
