"""The evaluator alone, with fakes: a scripted env, a constant policy, a fake params source."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podrace.control import Control, Heartbeat, Lifetime, Stopped
from podrace.evaluate import STUCK_EPISODE_STEPS, EpisodeTally, Evaluator, run_episodes
from podrace.metrics.registry import Metrics
from tests.helpers.actors import FakeParams, FixedLengthEnv, ScriptedEnv

pytestmark = pytest.mark.timeout(60)


def policy(params, obs):
    return jnp.zeros(obs.shape[0], jnp.int32)


def control(lifetime=None):
    return Control(lifetime or Lifetime(), Heartbeat("evaluator"), lambda metrics: None)


def test_run_episodes_returns_exactly_the_episodes_asked_for():
    # Env 0 ends episodes at steps 2 and 5, env 1 at step 2: three episodes by step 5.
    env = ScriptedEnv([{2: "terminated", 5: "truncated"}, {2: "terminated"}])
    returns, lengths = run_episodes(env, jax.jit(policy), None, jax.devices()[0], 1, control())
    assert env.steps == 2  # two episodes ended together; one was asked for
    assert returns.tolist() == [2.0] and lengths.tolist() == [2]


def test_each_env_counts_its_own_share_so_short_episodes_are_not_over_counted():
    # The first four episodes to end would be env 0's four one-step episodes (mean 1).
    returns, lengths = run_episodes(
        FixedLengthEnv([1, 10]), jax.jit(policy), None, jax.devices()[0], 4, control()
    )
    assert sorted(lengths.tolist()) == [1, 1, 10, 10]
    assert returns.mean() == 5.5


@pytest.mark.slow
def test_an_env_that_never_ends_its_episode_is_given_up_not_waited_for_forever(caplog):
    """With per-env shares, one eval env whose episode never ends (no time limit) is given
    up, so the final evaluation ends."""
    env = FixedLengthEnv([2, 10**9])
    returns, lengths = run_episodes(env, jax.jit(policy), None, jax.devices()[0], 4, control())
    assert lengths.tolist() == [2, 2, 2, 2]  # env 0's two, then two past its share for env 1's
    tally = EpisodeTally(2, 2)
    for _ in range(STUCK_EPISODE_STEPS):
        tally.add(np.array([True, False]), np.array([2.0, 0.0]), np.array([2, 0]))
    assert tally.complete and tally.filled == 1
    assert env.t[0] == STUCK_EPISODE_STEPS
    assert "env(s) [1] have not ended an episode in 10000 steps" in caplog.text


def test_no_env_is_given_up_before_its_declared_time_limit():
    """An env trained with --env.max-episode-steps 20000 is not given up at 10,000 steps (nor
    does `podrace eval` then ask for a time limit)."""
    tally = EpisodeTally(2, 2, time_limit=20_000)
    for _ in range(15_000):
        tally.add(np.array([True, False]), np.array([1.0, 0.0]), np.array([1, 0]))
    assert not tally.complete and tally.filled == 0  # env 1 is still waited for
    tally.add(np.array([False, True]), np.array([0.0, 7.0]), np.array([0, 15_001]))
    assert tally.complete and tally.result()[0].tolist() == [1.0, 7.0]


def test_when_no_env_ever_ends_an_episode_the_evaluation_ends_with_none():
    returns, lengths = run_episodes(
        FixedLengthEnv([10**9] * 3), jax.jit(policy), None, jax.devices()[0], 3, control()
    )
    assert len(returns) == len(lengths) == 0  # the caller reports it (nan; podrace eval: an error)


@pytest.mark.slow
def test_a_long_but_finite_episode_is_waited_for():
    returns, lengths = run_episodes(
        FixedLengthEnv([10, 3000]), jax.jit(policy), None, jax.devices()[0], 4, control()
    )
    assert sorted(lengths.tolist()) == [10, 10, 3000, 3000]


def test_a_tally_of_several_steps_at_once_counts_each_env_up_to_its_quota_in_step_order():
    tally = EpisodeTally(5, 2)  # quotas 3 and 2
    done = np.array([[1, 0], [1, 1], [1, 0], [1, 0]], bool)  # [steps, envs]
    returns = np.arange(8.0).reshape(4, 2)
    tally.add(done, returns, returns + 100)
    assert not tally.complete  # env 1 has one of its two
    assert tally.returns == [0.0, 2.0, 3.0, 4.0]
    tally.add(
        np.array([True, True]), np.array([50.0, 51.0]), np.array([1, 2])
    )  # env 0 is past its quota
    assert tally.complete
    returns, lengths = tally.result()
    assert returns.tolist() == [0.0, 2.0, 3.0, 4.0, 51.0]
    assert lengths.tolist() == [100.0, 102.0, 103.0, 104.0, 2.0]


def test_a_stop_is_seen_within_one_evaluation_step():
    lifetime = Lifetime()

    def stop_at(step):
        if step == 3:
            lifetime.stop("test")

    env = ScriptedEnv([{50: "terminated"}, {}], on_step=stop_at)
    with pytest.raises(Stopped):
        run_episodes(env, jax.jit(policy), None, jax.devices()[0], 1, control(lifetime))
    assert env.steps == 3


def test_every_evaluation_step_is_watched_by_the_heartbeat():
    seen = []
    ctl = control()

    def in_step(step):
        seen.append(ctl.heartbeat.overdue(1e12, 1.0))

    env = ScriptedEnv([{2: "terminated"}, {2: "terminated"}], on_step=in_step)
    run_episodes(env, jax.jit(policy), None, jax.devices()[0], 1, ctl)
    assert seen == [f"evaluation env.step did not return within 1s (step {s})" for s in (1, 2)]


def test_final_evaluation_returns_when_the_run_stops():
    lifetime = Lifetime()
    evaluator = Evaluator(
        ScriptedEnv([{}, {}]),
        jax.devices()[0],
        jax.jit(policy),
        FakeParams(),
        1,
        Metrics(),
        control(lifetime),
    )
    # No evaluator thread runs: only the stop can end the wait.
    outcome = []

    def final():
        try:
            evaluator.evaluate_final(0)
        except Stopped:
            outcome.append("stopped")

    waiter = threading.Thread(target=final, daemon=True)
    waiter.start()
    waiter.join(0.2)
    lifetime.stop("test")
    waiter.join(10)
    assert not waiter.is_alive() and outcome == ["stopped"]


def test_busy_evaluator_drops_and_counts_requests():
    metrics = Metrics()
    evaluator = Evaluator(
        ScriptedEnv([{}, {}]),
        jax.devices()[0],
        jax.jit(policy),
        FakeParams(),
        1,
        metrics,
        control(),
    )
    assert metrics.collect()["eval/dropped_requests"] == 0  # reported before anything is dropped
    evaluator.request(1)
    evaluator.request(2)
    evaluator.request(3)
    assert metrics.total("eval/dropped_requests") == 2
    np.testing.assert_equal(len(evaluator.requests), 1)


# Compiled evaluation (envpool's XLA step): the same episodes as the step-by-step loop.


def _envpool_evaluation(env_id, num_envs, episodes, compiled, core="none", **env_kwargs):
    """(returns, lengths) of the evaluator's episodes; `compiled` "command": `podrace eval`'s
    loop (`play_episodes`) instead."""
    from podrace.commands.playing import make_actor, play_episodes
    from podrace.config import EnvConfig, NetworkConfig
    from podrace.envs.envpool_backend import EnvpoolEnv
    from podrace.evaluate import make_greedy_policy
    from podrace.networks import make_network

    env = EnvpoolEnv(EnvConfig(id=env_id, **env_kwargs), num_envs, seed=11)
    net = make_network(NetworkConfig(hidden_sizes=(16,), core=core, core_size=16), env.spec)
    device = jax.devices("cpu")[0]
    # Large random weights: greedy actions that depend on the observation, so episodes differ.
    params = net.init(
        jax.random.PRNGKey(2), np.zeros((1,) + env.spec.obs_shape, env.spec.obs_dtype)
    )
    params = jax.device_put(jax.tree.map(lambda x: x * 30.0, params), device)
    if compiled == "command":
        tally = play_episodes(env, make_actor(net.apply, params, False, 0), episodes)
        env.close()
        return tally.result()
    greedy = make_greedy_policy(net.apply)
    evaluator = Evaluator(env, device, greedy, FakeParams(), episodes, Metrics(), control())
    assert evaluator.fused is not None
    if not compiled:
        evaluator.fused = None
    evaluator.warm_up(params)
    with jax.transfer_guard("disallow"):
        out = run_episodes(env, greedy, params, device, episodes, control(), evaluator.fused)
    env.close()
    return out


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "env_id,num_envs,episodes,env_kwargs",
    [
        ("CartPole-v1", 5, 12, {}),
        ("Pendulum-v1", 3, 7, {"max_episode_steps": 37}),
        # Recurrent: the core carried through episode ends and reset as in training
        ("CartPole-v1", 5, 12, {"core": "lstm", "obs_indices": (0, 2)}),
        ("Pendulum-v1", 3, 7, {"core": "gru", "max_episode_steps": 37}),
    ],
    ids=["cartpole", "pendulum", "cartpole-positions-lstm", "pendulum-gru"],
)
def test_compiled_evaluation_ends_the_same_episodes_as_step_by_step(
    env_id, num_envs, episodes, env_kwargs
):
    returns, lengths = _envpool_evaluation(env_id, num_envs, episodes, True, **env_kwargs)
    host_returns, host_lengths = _envpool_evaluation(
        env_id, num_envs, episodes, False, **env_kwargs
    )
    assert len(returns) == episodes and len(set(returns.tolist())) > 1  # episodes that differ
    np.testing.assert_array_equal(returns, host_returns)  # same episodes, same order, same counts
    np.testing.assert_array_equal(lengths, host_lengths)
    if "core" in env_kwargs:  # and `podrace eval` plays them too
        command_returns, _ = _envpool_evaluation(
            env_id, num_envs, episodes, "command", **env_kwargs
        )
        np.testing.assert_allclose(command_returns, returns, rtol=1e-6)


@pytest.mark.timeout(120)
def test_compiled_evaluation_is_watched_per_chunk_and_sees_a_stop_between_chunks():
    from podrace.config import EnvConfig, NetworkConfig
    from podrace.envs.envpool_backend import EnvpoolEnv
    from podrace.evaluate import make_greedy_policy
    from podrace.fused_rollout import CHUNK_STEPS
    from podrace.networks import make_network

    env = EnvpoolEnv(EnvConfig(id="CartPole-v1"), 2, seed=0)
    net = make_network(NetworkConfig(), env.spec)
    device = jax.devices("cpu")[0]
    params = jax.device_put(net.init(jax.random.PRNGKey(1), np.zeros((1, 4), np.float32)), device)
    lifetime, calls = Lifetime(), []

    class StopAfterFirstChunk(Control):
        def call(self, what, step, fn, *args, steps=1):
            calls.append((what, step, steps))
            if len(calls) == 2:  # the reset ran and the first chunk is starting
                lifetime.stop("test")
                return fn(*args)  # this chunk runs; the next call must not
            return super().call(what, step, fn, *args, steps=steps)

    ctl = StopAfterFirstChunk(lifetime, Heartbeat("evaluator"), lambda _: None)
    evaluator = Evaluator(
        env, device, make_greedy_policy(net.apply), FakeParams(), 10_000, Metrics(), ctl
    )
    evaluator.warm_up(params)
    with pytest.raises(Stopped):
        run_episodes(env, evaluator.policy, params, device, 10_000, ctl, evaluator.fused)
    env.close()
    assert calls == [
        ("evaluation env.reset", 0, 1),
        ("evaluation env.step", CHUNK_STEPS, CHUNK_STEPS),
        ("evaluation env.step", 2 * CHUNK_STEPS, CHUNK_STEPS),
    ]


def test_envs_without_an_xla_step_are_evaluated_step_by_step():
    env = ScriptedEnv([{2: "terminated"}])
    evaluator = Evaluator(
        env, jax.devices()[0], jax.jit(policy), FakeParams(), 1, Metrics(), control()
    )
    assert evaluator.fused is None
    evaluator.warm_up(None)
