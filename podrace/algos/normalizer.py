"""The run's normalizer: observation statistics that travel with the params, reward scaling
that stays on the learner. Pure functions of the statistics in `algos.normalization`.

What is published: with observation normalization on, version v is the pytree
`{"params": params_v, "obs_stats": obs_stats_v}` and `acting_apply` normalizes inside the
jitted policy, so an actor (or the evaluator) acting with version v normalizes with
version v's statistics and nothing else: there is no actor-local state to drift.

What the learner trains on: the observations of a rollout normalized with the statistics of
the version stamped on it, i.e. exactly the inputs the behaviour policy saw. PPO's ratio
pi_theta(a | x) / mu(a | x) then compares the new params and the behaviour params on the
same x, so it is 1 at theta = behaviour params and the stored behaviour values (GAE,
value clipping) are values of those same inputs. The statistics are then updated with the
rollout's raw observations and published with the new params; between two versions they
move by one batch's worth of data, the same drift a VecNormalize wrapper has between the
rollout it stored and the next one it acts in.

Reward scaling does not change how anyone acts, so it needs no versioning: the learner
divides the rewards it consumes by the running std of each env's discounted return.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from podrace.algos.base import RecurrentApply, is_recurrent
from podrace.algos.normalization import (
    ReturnTracker,
    RunningStats,
    discounted_returns,
    init_stats,
    normalize,
    scale_rewards,
    update_stats,
)
from podrace.config import NormalizeConfig
from podrace.types import PyTree, Trajectory

ApplyFn = Callable[[PyTree, jax.Array], tuple]


class Normalizer(NamedTuple):
    """The learner's normalization state (checkpointable as one pytree); unused parts are None."""

    obs: RunningStats | None
    """Observation statistics (replicated over the learner mesh); published with the params."""
    returns: RunningStats | None
    """Statistics of the per-env discounted returns (replicated), for reward scaling."""
    tracker: ReturnTracker | None
    """Each env's discounted return so far: [num_actors * num_envs], sharded like the env axis."""


def init_normalizer(
    cfg: NormalizeConfig, obs_shape: tuple[int, ...], num_envs: int
) -> Normalizer | None:
    """Initial state for `num_envs` envs (all actors together); None when nothing is normalized."""
    if not (cfg.obs or cfg.reward):
        return None
    return Normalizer(
        obs=init_stats(tuple(obs_shape)) if cfg.obs else None,
        returns=init_stats(()) if cfg.reward else None,
        tracker=ReturnTracker(jnp.zeros((num_envs,), jnp.float32)) if cfg.reward else None,
    )


def acting_params(params: PyTree, normalizer: Normalizer | None) -> PyTree:
    """What the learner publishes: the params, with the observation statistics if any."""
    if normalizer is None or normalizer.obs is None:
        return params
    return {"params": params, "obs_stats": normalizer.obs}


def acting_apply(apply_fn: ApplyFn, cfg: NormalizeConfig) -> ApplyFn:
    """`apply_fn` on published snapshots: (acting params, raw obs) -> (dist, value); a
    recurrent network's (`RecurrentApply`) stays one, on raw observations."""
    if not cfg.obs:
        return apply_fn
    if is_recurrent(apply_fn):

        def unroll(published: PyTree, obs: jax.Array, valid: jax.Array, state: PyTree) -> tuple:
            obs = normalize(published["obs_stats"], obs, cfg.obs_clip)
            return apply_fn(published["params"], obs, valid, state)

        return RecurrentApply(unroll, apply_fn.initial_state)

    def apply(published: PyTree, obs: jax.Array) -> tuple:
        return apply_fn(published["params"], normalize(published["obs_stats"], obs, cfg.obs_clip))

    return apply


def normalize_batch(
    normalizer: Normalizer,
    trajs: tuple[Trajectory, ...],
    behaviour_obs_stats: tuple[RunningStats, ...],
    cfg: NormalizeConfig,
    gamma: float,
    axis_name: str | None = None,
) -> tuple[Normalizer, tuple[Trajectory, ...], jax.Array]:
    """Update the statistics from one batch (one trajectory per actor) and return the batch
    as the learner trains on it, and whether every updated statistic is finite (one inf or
    NaN observation or reward makes them non-finite for good: the learner must not accept
    or publish them; the same answer on every shard).

    Observations (and last_obs) of `trajs[i]` are normalized with `behaviour_obs_stats[i]`,
    the statistics of the version that acted; the observation statistics are then updated
    with the raw valid observations. Rewards are scaled with the return statistics updated
    by this batch. Inside shard_map, `axis_name` makes every shard hold the same statistics.
    """
    obs_stats, return_stats, tracker = normalizer
    if cfg.obs:
        obs = jnp.concatenate([t.obs for t in trajs], axis=1)
        valid = jnp.concatenate([t.valid for t in trajs], axis=1)
        obs_stats = update_stats(obs_stats, obs, valid, axis_name)
        trajs = tuple(
            t._replace(
                obs=normalize(s, t.obs, cfg.obs_clip),
                last_obs=normalize(s, t.last_obs, cfg.obs_clip),
            )
            for t, s in zip(trajs, behaviour_obs_stats, strict=True)
        )
    if cfg.reward:
        rewards, done, valid = (
            jnp.concatenate(parts, axis=1)
            for parts in zip(*((t.rewards, t.terminated | t.truncated, t.valid) for t in trajs))
        )
        tracker, returns = discounted_returns(tracker, rewards, done, valid, gamma)
        return_stats = update_stats(return_stats, returns, valid, axis_name)
        scaled = scale_rewards(return_stats, rewards, cfg.reward_clip)
        widths = [t.rewards.shape[1] for t in trajs]
        pieces = jnp.split(scaled, [sum(widths[: i + 1]) for i in range(len(widths) - 1)], axis=1)
        trajs = tuple(t._replace(rewards=r) for t, r in zip(trajs, pieces))
    normalizer = Normalizer(obs_stats, return_stats, tracker)
    finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(normalizer)]))
    if axis_name is not None:  # the tracker is sharded by env
        finite = jax.lax.pmin(finite.astype(jnp.int32), axis_name) > 0
    return normalizer, trajs, finite
