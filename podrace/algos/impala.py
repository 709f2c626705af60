"""IMPALA: V-trace actor-critic for the decoupled learner.

Target log-probabilities and values are recomputed with the current params; V-trace
corrects for the policy lag between the behaviour and the learner. The local env axis
is split into num_minibatches groups of whole time sequences (one pass over the data).
Masked means use the global valid count, so a mesh of equal shards computes what one
device would on the whole batch.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from podrace.algos.advantages import vtrace
from podrace.algos.base import Algorithm, TrainState
from podrace.algos.common import (
    MaskedMean,
    Metrics,
    learning_rate_schedule,
    psum,
    reduce_metrics,
    init_state,
    make_minibatch_step,
)
from podrace.config import ImpalaConfig
from podrace.types import PyTree, Trajectory

ApplyFn = Callable[[PyTree, jax.Array], tuple]


def impala_loss(
    params: PyTree,
    apply_fn: ApplyFn,
    traj: Trajectory,
    cfg: ImpalaConfig,
    axis_name: str | None,
) -> tuple[jax.Array, Metrics]:
    """Returns (this shard's share of the loss, global metrics) on a [T, b] trajectory.

    loss = -mean(log pi(a) * pg_adv) + vf_coef * mean(0.5 (vs - V)^2) - ent_coef * entropy,
    means over valid steps; approx_kl and clip_frac (fraction with pi/mu > rho_bar)
    measure the policy lag.
    """
    dist, values = apply_fn(params, traj.obs)
    _, last_value = apply_fn(params, traj.last_obs)
    logp = dist.log_prob(traj.actions)
    vs, pg_adv = vtrace(
        traj.logprobs, logp, traj.rewards, values, last_value, traj.terminated,
        traj.truncated, traj.valid, cfg.gamma, cfg.vtrace_lambda, cfg.rho_bar, cfg.c_bar,
    )
    masked = MaskedMean(traj.valid, axis_name)
    shares = {
        "policy_loss": masked.share(-logp * pg_adv),
        "value_loss": masked.share(0.5 * jnp.square(vs - values)),
        "entropy": masked.share(dist.entropy()),
    }
    loss = shares["policy_loss"] + cfg.vf_coef * shares["value_loss"] - cfg.ent_coef * shares["entropy"]
    log_ratio = logp - traj.logprobs
    ratio = jnp.exp(log_ratio)
    stats = {
        **shares,
        "loss": loss,
        "approx_kl": masked.share((ratio - 1.0) - log_ratio),
        "clip_frac": masked.share((ratio > cfg.rho_bar).astype(jnp.float32)),
    }
    return loss, jax.lax.stop_gradient(psum(stats, axis_name))


def _split_envs(traj: Trajectory, num_mb: int, key: jax.Array) -> Trajectory:
    """[T, B, ...] -> [num_mb, T, B / num_mb, ...] (last_obs/last_value: [num_mb, B / num_mb, ...]).

    Envs are shuffled with `key` first when there is more than one minibatch.
    """
    num_envs = traj.last_value.shape[0]
    if num_envs % num_mb:
        raise ValueError(f"impala.num_minibatches ({num_mb}) must divide the envs per shard ({num_envs})")
    if num_mb > 1:
        perm = jax.random.permutation(key, num_envs)
        traj = traj._replace(
            **{f: jnp.take(getattr(traj, f), perm, axis=0) for f in ("last_obs", "last_value")},
            **{
                f: jnp.take(getattr(traj, f), perm, axis=1)
                for f in traj._fields
                if f not in ("last_obs", "last_value")
            },
        )

    def split_time_major(x):
        x = x.reshape((x.shape[0], num_mb, -1) + x.shape[2:])
        return jnp.moveaxis(x, 1, 0)

    def split_env_major(x):
        return x.reshape((num_mb, -1) + x.shape[1:])

    return Trajectory(
        **{
            f: (split_env_major if f in ("last_obs", "last_value") else split_time_major)(getattr(traj, f))
            for f in traj._fields
        }
    )


def make_impala(
    cfg: ImpalaConfig,
    apply_fn: ApplyFn,
    num_updates: int,
    axis_name: str | None,
    scan_unroll: int = 1,
) -> Algorithm:
    """IMPALA as an Algorithm; `apply_fn(params, obs) -> (dist, value)`.

    RMSProp (decay, eps inside the sqrt as in the paper's TF optimizer) after global-norm
    clipping; optional linear decay to 0 over num_updates * num_minibatches steps.
    """
    num_mb = cfg.num_minibatches
    schedule = learning_rate_schedule(cfg.learning_rate, cfg.anneal_lr, num_updates * num_mb)
    optimizer = optax.chain(
        optax.clip_by_global_norm(cfg.max_grad_norm),
        optax.rmsprop(schedule, decay=cfg.rmsprop_decay, eps=cfg.rmsprop_eps),
    )

    def loss_fn(params, minibatch):
        return impala_loss(params, apply_fn, minibatch, cfg, axis_name)

    init = init_state(optimizer)
    minibatch_step = make_minibatch_step(optimizer, loss_fn, schedule, axis_name)

    def update(state: TrainState, traj: Trajectory, keys: jax.Array) -> tuple[TrainState, Metrics]:
        # Env shuffling (num_minibatches > 1 only) uses the first local env's key, so it is
        # shard-local: unlike PPO's, IMPALA minibatches depend on the learner count.
        minibatches = _split_envs(traj, num_mb, keys[0])
        carry = (state.params, state.opt_state, state.step * num_mb)
        (params, opt_state, _), metrics = jax.lax.scan(
            minibatch_step, carry, minibatches, unroll=min(scan_unroll, num_mb)
        )
        return TrainState(params, opt_state, state.step + 1), reduce_metrics(metrics)

    return Algorithm(init=init, update=update)
