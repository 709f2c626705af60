"""Small networks and random trajectories shared by the algorithm tests."""

from __future__ import annotations

from functools import cache, partial

import jax
import jax.numpy as jnp
import numpy as np

from podrace.config import NetworkConfig
from podrace.networks import make_network
from podrace.types import EnvSpec, Trajectory
from tests.algos.numpy_reference import episode_patterns

OBS_DIM = 5
NUM_ACTIONS = 3
ACTION_DIM = 2


@cache
def small_network(discrete: bool, shared_torso: bool = False):
    """(net, params), cached: orthogonal init compiles slowly on CPU (~1 s per shape)."""
    spec = (
        EnvSpec((OBS_DIM,), np.float32, NUM_ACTIONS, ())
        if discrete
        else EnvSpec((OBS_DIM,), np.float32, None, (ACTION_DIM,))
    )
    net = make_network(NetworkConfig(hidden_sizes=(16, 16), shared_torso=shared_torso), spec)
    return net, _noisy_init(net)


@partial(jax.jit, static_argnums=0)
def _noisy_init(net):
    params = net.init(jax.random.PRNGKey(0), jnp.zeros((OBS_DIM,)))
    # Make the heads non-trivial so ratios, clipping and entropies vary across samples.
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
    leaves = [x + 0.3 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
    return jax.tree.unflatten(treedef, leaves)


@partial(jax.jit, static_argnums=0)
def _act(net, params, obs, last_obs, key):
    dist, values = net.apply(params, obs)
    _, last_value = net.apply(params, last_obs)
    actions = dist.sample(key)
    return actions, dist.log_prob(actions), values, last_value


def random_trajectory(
    net, params, discrete: bool, T: int, B: int, seed: int, lag_noise: float = 0.3
):
    """A trajectory whose behaviour log-probs/values are the network's plus noise (policy lag)."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(T, B, OBS_DIM)).astype(np.float32)
    last_obs = rng.normal(size=(B, OBS_DIM)).astype(np.float32)
    actions, logprobs, values, last_value = _act(
        net, params, obs, last_obs, jax.random.PRNGKey(seed)
    )
    logprobs = logprobs + lag_noise * rng.normal(size=(T, B))
    terminated, truncated, valid = episode_patterns(rng, T, B)
    return Trajectory(
        obs=jnp.asarray(obs),
        actions=actions,
        logprobs=jnp.asarray(logprobs, jnp.float32),
        values=jnp.asarray(values + lag_noise * rng.normal(size=(T, B)), jnp.float32),
        rewards=jnp.asarray(rng.normal(size=(T, B)), jnp.float32),
        terminated=jnp.asarray(terminated),
        truncated=jnp.asarray(truncated),
        valid=jnp.asarray(valid),
        last_obs=jnp.asarray(last_obs),
        last_value=jnp.asarray(last_value + lag_noise * rng.normal(size=(B,)), jnp.float32),
    )
