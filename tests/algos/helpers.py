"""Small networks and random trajectories shared by the algorithm tests."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, partial

import jax
import jax.numpy as jnp
import numpy as np

from podrace.algos.base import is_recurrent
from podrace.algos.ppo import PPOBatch
from podrace.config import NetworkConfig
from podrace.networks import make_network
from podrace.types import EnvSpec, Trajectory
from tests.algos.numpy_reference import episode_patterns

OBS_DIM = 5
NUM_ACTIONS = 3
ACTION_DIM = 2


@cache
def small_network(discrete: bool, shared_torso: bool = False, core: str = "none"):
    """(net, params), cached: orthogonal init compiles slowly on CPU (~1 s per shape).
    `core` lstm or gru: a recurrent network (a core of 8)."""
    spec = (
        EnvSpec((OBS_DIM,), np.float32, NUM_ACTIONS, ())
        if discrete
        else EnvSpec((OBS_DIM,), np.float32, None, (ACTION_DIM,))
    )
    cfg = NetworkConfig(hidden_sizes=(16, 16), shared_torso=shared_torso, core=core, core_size=8)
    net = make_network(cfg, spec)
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
def _act(net, params, obs, last_obs, key, valid, core_state):
    if is_recurrent(net.apply):
        all_obs = jnp.concatenate([obs, last_obs[None]])
        all_valid = jnp.concatenate([valid, jnp.ones_like(valid[:1])])
        dist, values, _ = net.apply(params, all_obs, all_valid, core_state)
        dist, values, last_value = jax.tree.map(lambda x: x[:-1], dist), values[:-1], values[-1]
    else:
        dist, values = net.apply(params, obs)
        _, last_value = net.apply(params, last_obs)
    actions = dist.sample(key)
    return actions, dist.log_prob(actions), values, last_value


def random_trajectory(
    net, params, discrete: bool, T: int, B: int, seed: int, lag_noise: float = 0.3
):
    """A trajectory whose behaviour log-probs/values are the network's plus noise (policy lag);
    a recurrent network's is stamped with a random core state it unrolls from."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(T, B, OBS_DIM)).astype(np.float32)
    last_obs = rng.normal(size=(B, OBS_DIM)).astype(np.float32)
    core_state, patterns = (), None
    if is_recurrent(net.apply):  # drawn from a stream of their own: the other draws stay
        core_rng = np.random.default_rng([seed, 1])
        patterns = episode_patterns(core_rng, T, B)
        core_state = jax.tree.map(
            lambda x: core_rng.normal(size=x.shape).astype(np.float32),
            net.apply.initial_state(B),
        )
    valid = np.ones((T, B), bool) if patterns is None else patterns[2]
    actions, logprobs, values, last_value = _act(
        net, params, obs, last_obs, jax.random.PRNGKey(seed), valid, core_state
    )
    logprobs = logprobs + lag_noise * rng.normal(size=(T, B))
    terminated, truncated, valid = episode_patterns(rng, T, B) if patterns is None else patterns
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
        core_state=jax.tree.map(jnp.asarray, core_state),
    )


def ppo_minibatch(traj: Trajectory, rng: np.random.Generator) -> PPOBatch:
    """All of `traj` as one flat PPO minibatch, with random advantages and returns."""
    n = traj.valid.size
    flat = lambda x: jnp.reshape(x, (n,) + x.shape[2:])  # noqa: E731
    return PPOBatch(
        obs=flat(traj.obs),
        actions=flat(traj.actions),
        logprobs=flat(traj.logprobs),
        values=flat(traj.values),
        advantages=jnp.asarray(rng.normal(1.0, 2.0, size=n), jnp.float32),
        returns=flat(traj.values) + jnp.asarray(rng.normal(size=n), jnp.float32),
        valid=flat(traj.valid),
    )


def summed_impala_loss(net, traj: Trajectory, vs, pg, cfg) -> Callable:
    """The per-step IMPALA loss SUMMED over valid steps, as Cleanba computes it, with vs and
    the policy-gradient advantages `pg` given as data: a function of the params."""
    w = jnp.asarray(traj.valid).astype(jnp.float32)

    def summed(p):
        d, v = net.apply(p, traj.obs)
        return jnp.sum(
            w
            * (
                -d.log_prob(traj.actions) * pg
                + cfg.vf_coef * 0.5 * (vs - v) ** 2
                - cfg.ent_coef * d.entropy()
            )
        )

    return summed
