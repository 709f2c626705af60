"""Observation normalization and reward scaling as pure functions of versioned statistics.

The learner updates the statistics from the trajectories it consumes and publishes them
in the same snapshot as the params, so whoever acts with version v also normalizes with
version v's statistics (per-process wrappers would drift apart between actors). Under
`shard_map`, pass the mesh axis name: counts and sums are `psum`med so every learner shard
holds the same statistics.

Reward scaling divides rewards by the running standard deviation of each env's discounted
return (the `VecNormalize` / Gymnasium `NormalizeReward` rule); the learner carries the
per-env return across rollouts in `ReturnTracker`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

INITIAL_COUNT = 1e-4
"""Weight of the prior (mean 0, variance 1), so the first batch is not divided by zero."""


class RunningStats(NamedTuple):
    """Mean and (population) variance of everything seen so far, and how much that was."""

    count: jax.Array  # [] float32
    mean: jax.Array  # [*shape]
    var: jax.Array  # [*shape]


def init_stats(shape: tuple[int, ...]) -> RunningStats:
    return RunningStats(
        jnp.asarray(INITIAL_COUNT, jnp.float32),
        jnp.zeros(shape, jnp.float32),
        jnp.ones(shape, jnp.float32),
    )


def _psum(x: jax.Array, axis_name: str | None) -> jax.Array:
    return x if axis_name is None else jax.lax.psum(x, axis_name)


def update_stats(
    stats: RunningStats, x: jax.Array, valid: jax.Array, axis_name: str | None = None
) -> RunningStats:
    """Merge the samples x[valid] into `stats` (Chan et al.'s parallel mean/variance).

    x: [*batch, *shape], valid: [*batch] bool (autoreset steps carry no new observation).
    """
    batch_ndim = valid.ndim
    w = valid.astype(jnp.float32).reshape(valid.shape + (1,) * (x.ndim - batch_ndim))
    x = x.astype(jnp.float32)
    axes = tuple(range(batch_ndim))
    n = _psum(jnp.sum(valid.astype(jnp.float32)), axis_name)
    safe_n = jnp.maximum(n, 1.0)
    mean_b = _psum(jnp.sum(w * x, axis=axes), axis_name) / safe_n
    var_b = _psum(jnp.sum(w * jnp.square(x - mean_b), axis=axes), axis_name) / safe_n
    total = stats.count + n
    delta = mean_b - stats.mean
    mean = stats.mean + delta * (n / total)
    m2 = stats.var * stats.count + var_b * n + jnp.square(delta) * stats.count * n / total
    return RunningStats(total, mean, m2 / total)


def normalize(
    stats: RunningStats, x: jax.Array, clip: float = 10.0, eps: float = 1e-8
) -> jax.Array:
    """(x - mean) / std, clipped to [-clip, clip]."""
    z = (x.astype(jnp.float32) - stats.mean) / jnp.sqrt(stats.var + eps)
    return jnp.clip(z, -clip, clip)


class ReturnTracker(NamedTuple):
    """Each env's discounted return so far (carried by the learner across rollouts)."""

    returns: jax.Array  # [B]


def discounted_returns(
    tracker: ReturnTracker, rewards: jax.Array, done: jax.Array, valid: jax.Array, gamma: float
) -> tuple[ReturnTracker, jax.Array]:
    """Running discounted return after each step of a [T, B] rollout.

    done: terminated | truncated at that step (the next step starts a new episode). Invalid
    (autoreset) steps leave the return at 0, as the episode has not started yet.
    """

    def step(g, inputs):
        r, d, v = inputs
        g = jnp.where(v, g * gamma + r, 0.0)
        return jnp.where(d, 0.0, g), g

    last, per_step = jax.lax.scan(step, tracker.returns, (rewards, done, valid))
    return ReturnTracker(last), per_step


def scale_rewards(
    return_stats: RunningStats, rewards: jax.Array, clip: float = 10.0, eps: float = 1e-8
) -> jax.Array:
    """rewards / std(discounted return), clipped to [-clip, clip]; the mean is not removed."""
    return jnp.clip(rewards / jnp.sqrt(return_stats.var + eps), -clip, clip)
