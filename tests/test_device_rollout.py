"""JAX envs on the actor's device: a compiled rollout (env state in the scan's carry) equals
the step-by-step rollout with the same keys, and evaluation runs either way alike."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from podrace.actor import make_policy_fns
from podrace.config import EnvConfig, NetworkConfig
from podrace.control import Control, Heartbeat, Lifetime
from podrace.envs import make_env
from podrace.evaluate import make_greedy_policy, run_episodes
from podrace.fused_rollout import fused_episodes_for, fused_rollout_for
from tests.helpers.actors import init_params, run_actor

ROLLOUTS = 3
GUESS = "tests.envs.jax_user_envs:guess"


def control() -> Control:
    return Control(Lifetime(), Heartbeat("actor-0"), lambda _: None)


def jax_envs(env_id: str, num_envs: int):
    return make_env(EnvConfig(id=env_id, backend="jax"), num_envs, seed=7)


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "env_id,num_envs,T,network",
    [
        ("gymnax:CartPole-v1", 8, 40, NetworkConfig()),  # two calls per rollout: 32 + 8
        (GUESS, 6, 8, NetworkConfig()),  # episodes of 1-5 steps: autoresets everywhere
        (GUESS, 6, 40, NetworkConfig(hidden_sizes=(16,), core="lstm", core_size=16)),
    ],
    ids=["cartpole", "guess", "guess-lstm"],
)
def test_device_rollouts_equal_step_by_step_rollouts(env_id, num_envs, T, network):
    fused = run_actor(jax_envs(env_id, num_envs), T, True, network, ROLLOUTS, must_fuse=True)
    stepped = run_actor(jax_envs(env_id, num_envs), T, False, network, ROLLOUTS, must_fuse=True)
    assert len(fused) == len(stepped) == ROLLOUTS
    ends = 0
    for a, b in zip(fused, stepped):
        ta, tb = jax.device_get(a.trajectory), jax.device_get(b.trajectory)
        for name in ("obs", "actions", "rewards", "terminated", "truncated", "valid", "last_obs"):
            x, y = getattr(ta, name), getattr(tb, name)
            assert x.dtype == y.dtype and x.shape == y.shape, name
            np.testing.assert_array_equal(x, y, err_msg=name)
        for name in ("logprobs", "values", "last_value"):
            np.testing.assert_allclose(
                getattr(ta, name), getattr(tb, name), rtol=1e-5, atol=1e-5, err_msg=name
            )
        for x, y in zip(jax.tree.leaves(ta.core_state), jax.tree.leaves(tb.core_state)):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5, err_msg="core_state")
        np.testing.assert_allclose(a.episode_returns, b.episode_returns, rtol=1e-6)
        np.testing.assert_array_equal(a.episode_lengths, b.episode_lengths)
        ends += len(a.episode_returns) + int((~tb.valid).sum())
    assert ends > 0  # the comparison crossed episode boundaries


def test_device_envs_fuse_on_any_device_and_not_through_a_wrapper():
    env = make_env(EnvConfig(id=GUESS, backend="jax"), 2, seed=0)
    net, _ = init_params(NetworkConfig(), env)
    policy = make_policy_fns(net.apply).on(jax.devices("cpu")[0])
    accelerator = dataclasses.replace(policy, device=type("Gpu", (), {"platform": "gpu"})())
    assert fused_rollout_for(env, accelerator, 8) is not None

    class Wrapper:  # changes step, forwards everything else: fusing would bypass its step
        def __init__(self, env):
            self.env = env

        def __getattr__(self, name):
            return getattr(self.env, name)

    assert fused_rollout_for(Wrapper(env), policy, 8) is None


@pytest.mark.timeout(120)
def test_evaluation_on_device_equals_step_by_step():
    device = jax.devices("cpu")[0]
    results = []
    for fused in (True, False):
        env = make_env(EnvConfig(id=GUESS, backend="jax"), 4, seed=11)
        net, params = init_params(NetworkConfig(), env)
        greedy = make_greedy_policy(net.apply)
        episodes = fused_episodes_for(env, greedy, device) if fused else None
        assert fused is (episodes is not None)
        if episodes is not None:
            episodes.compile(params, np.zeros((4,) + env.spec.obs_shape, np.float32))
        results.append(run_episodes(env, greedy, params, device, 10, control(), episodes))
    (returns_a, lengths_a), (returns_b, lengths_b) = results
    assert len(returns_a) == 10
    np.testing.assert_array_equal(returns_a, returns_b)
    np.testing.assert_array_equal(lengths_a, lengths_b)
