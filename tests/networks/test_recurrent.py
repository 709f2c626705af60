"""The recurrent core between torso and heads, and its reset rule (podrace.networks.recurrent)."""

from functools import cache

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podrace.algos.base import RecurrentApply, is_recurrent
from podrace.algos.distributions import Categorical, Gaussian
from podrace.config import NetworkConfig
from podrace.networks import (
    ActorCritic,
    RecurrentNetwork,
    initial_core_state,
    make_network,
)
from podrace.networks.recurrent import reset_after_invalid
from podrace.types import EnvSpec

DISCRETE = EnvSpec((3,), np.float32, 2, ())
CONTINUOUS = EnvSpec((3,), np.float32, None, (2,))


@cache
def built(core: str, spec: EnvSpec = DISCRETE):
    net = make_network(NetworkConfig(hidden_sizes=(16,), core=core, core_size=8), spec)
    params = jax.jit(net.init)(jax.random.PRNGKey(0), jnp.zeros((1,) + spec.obs_shape))
    return net, params


def observations(steps: int, batch: int, seed: int = 0) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).normal(size=(steps, batch, 3)), jnp.float32)


def leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_core_none_is_the_feed_forward_network():
    net = make_network(NetworkConfig(), DISCRETE)
    assert isinstance(net, ActorCritic) and not is_recurrent(net.apply)
    assert initial_core_state(NetworkConfig(), 4) == ()


@pytest.mark.parametrize("core", ["lstm", "gru"])
@pytest.mark.parametrize("spec", [DISCRETE, CONTINUOUS], ids=["discrete", "continuous"])
def test_unroll_shapes_and_state(core, spec):
    net, params = built(core, spec)
    assert isinstance(net, RecurrentNetwork) and isinstance(net.apply, RecurrentApply)
    state = net.apply.initial_state(4)
    assert jax.tree.structure(state) == jax.tree.structure(
        initial_core_state(NetworkConfig(core=core, core_size=8), 4)
    )
    assert all(x.shape == (4, 8) and x.dtype == np.float32 for x in leaves(state))
    dist, value, states = jax.jit(net.apply)(
        params, observations(5, 4), jnp.ones((5, 4), bool), state
    )
    assert isinstance(dist, Categorical if spec.discrete else Gaussian)
    assert value.shape == (5, 4)
    assert all(x.shape == (5, 4, 8) for x in leaves(states))
    assert ("core" in params["params"]) and ("value_torso" not in params["params"])


@pytest.mark.parametrize("core", ["lstm", "gru"])
def test_an_unroll_is_its_steps_one_at_a_time(core):
    """What a learner unrolls over a rollout is what an actor computes step by step."""
    net, params = built(core)
    obs = observations(6, 3)
    valid = jnp.asarray(np.random.default_rng(1).uniform(size=(6, 3)) < 0.7)
    apply = jax.jit(net.apply)
    dist, value, states = apply(params, obs, valid, net.apply.initial_state(3))
    state = net.apply.initial_state(3)
    for t in range(6):
        step_dist, step_value, step_states = apply(params, obs[t : t + 1], valid[t : t + 1], state)
        np.testing.assert_allclose(step_dist.logits[0], dist.logits[t], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(step_value[0], value[t], rtol=1e-5, atol=1e-6)
        state = jax.tree.map(lambda x: x[0], step_states)
        for a, b in zip(leaves(state), leaves(jax.tree.map(lambda x, t=t: x[t], states))):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_reset_after_invalid_zeroes_only_the_invalid_envs():
    state = (jnp.ones((3, 2)), jnp.full((3, 2), 2.0))
    c, h = reset_after_invalid(state, jnp.array([True, False, True]))
    np.testing.assert_array_equal(c, [[1, 1], [0, 0], [1, 1]])
    np.testing.assert_array_equal(h, [[2, 2], [0, 0], [2, 2]])


@pytest.mark.parametrize("core", ["lstm", "gru"])
def test_the_step_after_an_autoreset_step_starts_from_the_initial_state(core):
    """Env 0 ends an episode at step 1, so step 2 is its autoreset step (invalid: it acts on
    the final observation, with the episode's memory) and step 3 is the first of the new
    episode: it acts exactly as the first step after a reset does, whatever came before."""
    net, params = built(core)
    apply = jax.jit(net.apply)
    obs = observations(6, 2, seed=3)
    valid = jnp.ones((6, 2), bool).at[2, 0].set(False)
    fresh = net.apply.initial_state(2)
    dist, value, states = apply(params, obs, valid, fresh)

    # Step 3 of env 0 equals a fresh start on the same observations.
    restart_dist, restart_value, _ = apply(params, obs[3:], valid[3:], fresh)
    np.testing.assert_allclose(value[3:, 0], restart_value[:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dist.logits[3:, 0], restart_dist.logits[:, 0], rtol=1e-5, atol=1e-6)
    for x in leaves(jax.tree.map(lambda s: s[2, 0], states)):
        np.testing.assert_array_equal(x, 0.0)  # the state after the autoreset step
    # Env 1 never reset: its step 3 remembers steps 0-2.
    assert abs(float(value[3, 1]) - float(restart_value[0, 1])) > 1e-4
    # The autoreset step itself still has the episode's memory (not reset a step early).
    _, early, _ = apply(params, obs[2:3], valid[2:3], fresh)
    assert abs(float(value[2, 0]) - float(early[0, 0])) > 1e-4


def test_the_mask_of_a_step_does_not_change_its_own_output():
    """Only the state after a step depends on its mask (the bootstrap value of the final
    observation is computed with the episode's memory)."""
    net, params = built("lstm")
    obs, state = observations(1, 2), net.apply.initial_state(2)
    a = net.apply(params, obs, jnp.ones((1, 2), bool), state)
    b = net.apply(params, obs, jnp.zeros((1, 2), bool), state)
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_array_equal(a[0].logits, b[0].logits)
    assert np.abs(leaves(b[2])[0]).max() == 0.0 < np.abs(leaves(a[2])[0]).max()


def test_a_recurrent_network_refuses_a_feed_forward_call():
    net, params = built("lstm")
    with pytest.raises(TypeError):
        net.apply(params, jnp.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"observations \[T, B, \*\(3,\)\]"):
        net.apply(params, jnp.zeros((2, 3)), jnp.ones((2,), bool), net.apply.initial_state(2))
