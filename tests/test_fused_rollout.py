"""The rollout compiled into one XLA call computes what the step-by-step loop computes."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podrace.actor import Actor, ActorSettings, make_policy_fns
from podrace.config import EnvConfig, NetworkConfig
from podrace.control import Control, Heartbeat, Lifetime
from podrace.envs.envpool_backend import EnvpoolEnv
from podrace.fused_rollout import fused_rollout_for
from podrace.networks import make_network
from tests.helpers.actors import ROLLOUTS, FixedParams, ListSink, envpool_envs, run_actor


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "env_id,num_envs,T,network,env_kwargs",
    [
        (
            "CartPole-v1",
            8,
            40,
            NetworkConfig(),
            {},
        ),  # discrete, episodes end inside rollouts; chunks 32 + 8
        ("CartPole-v1", 16, 8, NetworkConfig(), {}),  # the cartpole-ppo shape: one call per rollout
        ("Pendulum-v1", 4, 64, NetworkConfig(), {}),  # continuous (clipped), truncated at 200 steps
        (
            "FrozenLake-v1",
            8,
            32,
            NetworkConfig(),
            {},
        ),  # Discrete observations, one-hot inside the rollout
        # Atari: lost lives terminate learning episodes, game over ends reported ones
        (
            "Breakout-v5",
            4,
            32,
            NetworkConfig(torso="nature_cnn", hidden_sizes=(32,)),
            {"image_size": 42},
        ),
        # Recurrent: the core's state carried in the scan, across chunks (32 + 8) and rollouts
        (
            "CartPole-v1",
            8,
            40,
            NetworkConfig(hidden_sizes=(16,), core="lstm", core_size=16),
            {"obs_indices": (0, 2)},
        ),
        ("Pendulum-v1", 4, 64, NetworkConfig(core="gru", core_size=16), {}),
        (
            "Breakout-v5",
            4,
            32,
            NetworkConfig(torso="nature_cnn", hidden_sizes=(32,), core="lstm", core_size=16),
            {"image_size": 42},
        ),
    ],
    ids=[
        "cartpole",
        "cartpole-one-call",
        "pendulum",
        "frozen-lake",
        "breakout",
        "cartpole-positions-lstm",
        "pendulum-gru",
        "breakout-lstm",
    ],
)
def test_fused_rollouts_equal_step_by_step_rollouts(env_id, num_envs, T, network, env_kwargs):
    fused = run_actor(envpool_envs(env_id, num_envs, **env_kwargs), T, True, network)
    stepped = run_actor(envpool_envs(env_id, num_envs, **env_kwargs), T, False, network)
    assert len(fused) == len(stepped) == ROLLOUTS
    ends = 0
    for a, b in zip(fused, stepped):
        ta, tb = jax.device_get(a.trajectory), jax.device_get(b.trajectory)
        # Continuous actions are sampled by two XLA programs (the fused scan and the policy
        # step) that need not round alike: bit for bit equal under XLA's default emitters,
        # ~1e-6 apart under the suite's (tests/conftest.py). The env feeds the difference
        # back into the observations and rewards, so those are compared to a tolerance.
        continuous = np.issubdtype(ta.actions.dtype, np.floating)
        for name in ("obs", "actions", "rewards", "terminated", "truncated", "valid", "last_obs"):
            x, y = getattr(ta, name), getattr(tb, name)
            assert x.dtype == y.dtype and x.shape == y.shape, name
            if continuous and np.issubdtype(x.dtype, np.floating):
                np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5, err_msg=name)
            else:
                np.testing.assert_array_equal(x, y, err_msg=name)
        for name in ("logprobs", "values", "last_value"):
            np.testing.assert_allclose(
                getattr(ta, name), getattr(tb, name), rtol=1e-5, atol=1e-5, err_msg=name
            )
        cores = jax.tree.leaves(ta.core_state), jax.tree.leaves(tb.core_state)
        assert len(cores[0]) == len(cores[1]) == {"none": 0, "gru": 1, "lstm": 2}[network.core]
        for x, y in zip(*cores):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5, err_msg="core_state")
            assert a.seq == 0 or np.abs(x).max() > 0  # a state carried from the last rollout
        np.testing.assert_allclose(a.episode_returns, b.episode_returns, rtol=1e-6)
        np.testing.assert_array_equal(a.episode_lengths, b.episode_lengths)
        assert (a.seq, a.policy_version) == (b.seq, b.policy_version)
        ends += len(a.episode_returns) + int((~tb.valid).sum())
    assert ends > 0  # the comparison crossed episode boundaries


def test_envs_jax_cannot_carry_and_accelerators_step_by_step():
    env = EnvpoolEnv(EnvConfig(id="HalfCheetah-v4"), 2, seed=0)  # float64 observations and actions
    net = make_network(NetworkConfig(), env.spec)
    policy = make_policy_fns(net.apply).on(jax.devices("cpu")[0])
    assert env.xla_step() is None and fused_rollout_for(env, policy, 8) is None
    env.close()
    cartpole = EnvpoolEnv(EnvConfig(id="CartPole-v1"), 2, seed=0)
    assert fused_rollout_for(cartpole, policy, 8) is not None
    accelerator = dataclasses.replace(policy, device=type("Gpu", (), {"platform": "gpu"})())
    assert fused_rollout_for(cartpole, accelerator, 8) is None

    class Wrapper:  # changes step, forwards everything else: fusing would bypass its step
        def __init__(self, env):
            self.env = env

        def __getattr__(self, name):
            return getattr(self.env, name)

        def step(self, actions):
            raise AssertionError("the wrapper's step must run")

    assert fused_rollout_for(Wrapper(cartpole), policy, 8) is None
    cartpole.close()


@pytest.mark.timeout(120)
def test_fused_and_host_episode_returns_agree_bit_for_bit():
    """Pendulum's float rewards: the host adapter's episode returns must equal those a
    fused rollout counts (in float32 on the device), not differ in the last digits."""
    from podrace.envs.episode_stats import count_step, zero_counts

    cfg = EnvConfig(id="Pendulum-v1", max_episode_steps=37)
    num_envs, steps = 3, 120
    actions = np.random.default_rng(0).uniform(-3, 3, (steps, num_envs, 1)).astype(np.float32)

    host = EnvpoolEnv(cfg, num_envs, seed=5)
    host.reset()
    host_returns = []
    for a in actions:
        step = host.step(a)
        host_returns.append(step.episode_return[step.episode_done])
    host.close()

    fused = EnvpoolEnv(cfg, num_envs, seed=5)
    obs = fused.reset()
    xla = fused.xla_step()

    @jax.jit
    def roll(handle, counts, actions):
        def body(state, action):
            handle, counts = state
            handle, step = xla(handle, action)
            counts, ret, _ = count_step(
                counts, step.raw_reward, step.terminated, step.truncated, step.episode_done, xp=jnp
            )
            return (handle, counts), (ret, step.episode_done)

        return jax.lax.scan(body, (handle, counts), actions)[1]

    rets, done = jax.device_get(
        roll(xla.handle, zero_counts(num_envs, np.float32, np.int32), actions)
    )
    fused.close()
    del obs
    fused_returns = np.asarray(rets[done], np.float64)
    host_returns = np.concatenate(host_returns)
    assert len(host_returns) == 9
    np.testing.assert_array_equal(host_returns, fused_returns)


def _cartpole_actor(
    num_envs: int, rollout_length: int, num_rollouts: int, control: type, lifetime: Lifetime
):
    """A compiled-rollout CartPole actor on CPU device 0 whose env calls go through `control`."""
    env = EnvpoolEnv(EnvConfig(id="CartPole-v1"), num_envs, seed=0)
    net = make_network(NetworkConfig(), env.spec)
    device = jax.devices("cpu")[0]
    params = jax.device_put(net.init(jax.random.PRNGKey(1), np.zeros((1, 4), np.float32)), device)
    settings = ActorSettings(
        0, rollout_length, num_rollouts, max_policy_lag=1, key=jax.random.PRNGKey(3)
    )
    sink = ListSink()
    actor = Actor(
        settings,
        env,
        make_policy_fns(net.apply).on(device),
        FixedParams(params),
        sink,
        control(lifetime, Heartbeat("actor-0"), lambda _: None),
    )
    actor.warm_up(params)
    return env, actor, sink


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_long_rollout_runs_in_watched_chunks_and_a_stop_is_seen_between_them():
    from podrace.control import Stopped
    from podrace.fused_rollout import CHUNK_STEPS, chunk_lengths

    assert chunk_lengths(2 * CHUNK_STEPS + 4) == [CHUNK_STEPS, CHUNK_STEPS, 4]
    assert chunk_lengths(CHUNK_STEPS) == [CHUNK_STEPS] and chunk_lengths(3) == [3]
    lifetime = Lifetime()
    calls = []

    class StopAfterFirstChunk(Control):
        def call(self, what, step, fn, *args, steps=1):
            calls.append((what, step, steps))
            if len(calls) == 3:  # reset and the first chunk ran: a stop arrives mid-rollout
                lifetime.stop("test")
            return super().call(what, step, fn, *args, steps=steps)

    env, actor, sink = _cartpole_actor(4, 3 * CHUNK_STEPS, 1, StopAfterFirstChunk, lifetime)
    with pytest.raises(Stopped):
        actor.run()
    # The runtime closes the envs after a stop: no chunk may still be running or queued
    # (envpool stepping a closed env fails with bad_alloc, or hangs later XLA calls).
    assert all(leaf.is_ready() for leaf in jax.tree.leaves(actor.fused.carry))
    env.close()
    jax.effects_barrier()
    assert calls == [
        ("env.reset", 0, 1),
        ("env.rollout", 0, CHUNK_STEPS),
        ("env.rollout", CHUNK_STEPS, CHUNK_STEPS),
    ]
    assert actor.env_steps == CHUNK_STEPS and not sink.rollouts  # the second chunk never ran


@pytest.mark.timeout(120)
def test_a_one_call_rollout_returns_only_once_it_ran():
    """A rollout of at most CHUNK_STEPS steps is one call (steps and trajectory together); it
    too returns only once its steps ran, so a stop right after it closes no env under it."""
    from podrace.control import Stopped

    lifetime = Lifetime()
    calls, ready = [], []

    class StopAfterTheRollout(Control):
        def call(self, what, step, fn, *args, steps=1):
            out = super().call(what, step, fn, *args, steps=steps)
            calls.append(what)
            if what == "env.rollout":  # the watched call's results: computed, not pending
                ready.append(all(leaf.is_ready() for leaf in jax.tree.leaves(out)))
                lifetime.stop("test")
            return out

    env, actor, sink = _cartpole_actor(64, 16, 3, StopAfterTheRollout, lifetime)
    with pytest.raises(Stopped):
        actor.run()
    assert calls == ["env.reset", "env.rollout"] and len(sink.rollouts) == 1
    assert ready == [True]
    env.close()
    jax.effects_barrier()
