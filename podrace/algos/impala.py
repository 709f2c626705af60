"""IMPALA: V-trace actor-critic for the decoupled learner.

Target log-probabilities and values are recomputed with the current params; V-trace
corrects for the policy lag between the behaviour and the learner. One update is one pass
over the data in num_minibatches optimizer steps, each on whole env sequences.

The optimizer sees the gradient of the loss SUMMED over the minibatch's valid samples (the
paper, scalable_agent, TorchBeast and Cleanba all sum), so the published RMSProp eps and
clip norm apply as they are for any batch size; the reported losses are means.

Minibatches are stratified by env: consecutive blocks of num_minibatches envs each deal
one env to every minibatch, in an order drawn from the envs' own keys. The learner lays
envs out in the same global order for any number of learner devices, and a block never
straddles two shards, so 1, 2 or 4 learner devices compute the same update.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Literal

import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from podrace.algos.advantages import vtrace
from podrace.algos.base import Algorithm, TrainState, is_recurrent
from podrace.algos.common import (
    MaskedMean,
    Metrics,
    learning_rate_schedule,
    make_minibatch_step,
    minibatch_envs,
    psum,
    reduce_metrics,
    take_envs,
)
from podrace.algos.tunable import reported, tunable_init, with_inputs
from podrace.config import ImpalaConfig
from podrace.types import PyTree, Trajectory

ApplyFn = Callable[[PyTree, jax.Array], tuple]

TRUNCATION_TOLERANCE = 0.01
"""A weight counts as truncated when the bar cuts at least 1% off it: float noise in the
recomputed log-probabilities alone puts half of all on-policy ratios a hair above 1."""

_ENV_MAJOR = ("last_obs", "last_value", "core_state")


def impala_loss(
    params: PyTree,
    apply_fn: ApplyFn,
    traj: Trajectory,
    cfg: ImpalaConfig,
    axis_name: str | None,
) -> tuple[jax.Array, Metrics]:
    """Returns (this shard's share of the SUMMED loss, global metrics as means) on [T, b].

    loss = sum over valid steps of -log pi(a) * pg_adv + vf_coef * 0.5 (vs - V)^2
    - ent_coef * entropy. Metrics: the same terms as means over valid steps, approx_kl, and
    rho_truncated / c_truncated, the fractions of importance weights cut by rho-bar / c-bar
    (how off-policy the data is).
    """
    if is_recurrent(apply_fn):
        dist, values, last_value = _unroll_with_bootstrap(params, apply_fn, traj)
    else:
        dist, values = apply_fn(params, traj.obs)
        _, last_value = apply_fn(params, traj.last_obs)
    logp = dist.log_prob(traj.actions)
    vs, pg_adv = vtrace(
        traj.logprobs,
        logp,
        traj.rewards,
        values,
        last_value,
        traj.terminated,
        traj.truncated,
        traj.valid,
        cfg.gamma,
        cfg.vtrace_lambda,
        cfg.rho_bar,
        cfg.c_bar,
    )
    masked = MaskedMean(traj.valid, axis_name)
    per_step = (
        -logp * pg_adv + cfg.vf_coef * 0.5 * jnp.square(vs - values) - cfg.ent_coef * dist.entropy()
    )
    summed = masked.local_sum(per_step)
    shares = {
        "policy_loss": masked.share(-logp * pg_adv),
        "value_loss": masked.share(0.5 * jnp.square(vs - values)),
        "entropy": masked.share(dist.entropy()),
    }
    log_ratio = logp - traj.logprobs
    cut = jnp.log1p(TRUNCATION_TOLERANCE)
    stats = {
        **shares,
        "loss": shares["policy_loss"]
        + cfg.vf_coef * shares["value_loss"]
        - cfg.ent_coef * shares["entropy"],
        "approx_kl": masked.share(jnp.expm1(log_ratio) - log_ratio),
        "rho_truncated": masked.share((log_ratio > jnp.log(cfg.rho_bar) + cut).astype(jnp.float32)),
        "c_truncated": masked.share((log_ratio > jnp.log(cfg.c_bar) + cut).astype(jnp.float32)),
    }
    return summed, jax.lax.stop_gradient(psum(stats, axis_name))


def _unroll_with_bootstrap(params: PyTree, apply_fn: ApplyFn, traj: Trajectory):
    """A recurrent network over the rollout from its stamped start state, and one step more
    on last_obs: (dist [T, b], values [T, b], last_value [b])."""
    steps = traj.obs.shape[0]
    obs = jnp.concatenate([traj.obs, traj.last_obs[None]])
    valid = jnp.concatenate([traj.valid, jnp.ones_like(traj.valid[:1])])
    dist, values, _ = apply_fn(params, obs, valid, traj.core_state)
    return jax.tree.map(lambda x: x[:steps], dist), values[:steps], values[steps]


def rmsprop(
    learning_rate: optax.ScalarOrSchedule, decay: float, eps: float, style: Literal["tf", "torch"]
) -> optax.GradientTransformation:
    """RMSProp in the convention a user's numbers come from (momentum 0, not centred).

    torch (PyTorch's RMSprop, used by Cleanba and TorchBeast): g / (sqrt(ms) + eps), ms from 0.
    tf (TF1's tf.train.RMSPropOptimizer, used by the paper's scalable_agent): g / sqrt(ms +
    eps), ms from 1. With the same eps the two take steps of very different sizes.
    """
    if style == "torch":
        return optax.rmsprop(
            learning_rate, decay=decay, eps=eps, initial_scale=0.0, eps_in_sqrt=False
        )
    if style == "tf":
        return optax.rmsprop(
            learning_rate, decay=decay, eps=eps, initial_scale=1.0, eps_in_sqrt=True
        )
    raise ValueError(f"unknown RMSProp style {style!r}")


def make_optimizer(
    cfg: ImpalaConfig, num_updates: int
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """(global-norm clip then RMSProp, its learning-rate schedule): one rate per update,
    as in Cleanba."""
    num_mb = cfg.num_minibatches
    schedule = learning_rate_schedule(
        cfg.learning_rate, cfg.anneal_lr, num_updates * num_mb, hold=num_mb
    )
    optimizer = optax.chain(
        optax.clip_by_global_norm(cfg.max_grad_norm),
        rmsprop(schedule, cfg.rmsprop_decay, cfg.rmsprop_eps, cfg.rmsprop_style),
    )
    return optimizer, schedule


def split_minibatches(traj: Trajectory, envs: jax.Array) -> Trajectory:
    """[T, B, ...] -> [num_mb, T, B / num_mb, ...] (last_obs, last_value and core_state:
    [num_mb, B / num_mb, ...])."""

    def take(name, x):
        return take_envs(x, envs, 0 if name in _ENV_MAJOR else 1)

    return Trajectory(
        **{name: jax.tree.map(partial(take, name), getattr(traj, name)) for name in traj._fields}
    )


def make_impala(
    cfg: ImpalaConfig,
    apply_fn: ApplyFn,
    num_updates: int,
    axis_name: str | None,
    scan_unroll: int = 1,
    tunable: Sequence[str] = (),
) -> Algorithm:
    """IMPALA as an Algorithm; `apply_fn(params, obs) -> (dist, value)`.

    `tunable` names ImpalaConfig fields (learning_rate, ent_coef, gamma, vtrace_lambda)
    that are inputs of the update instead of constants of its program (see `make_ppo`)."""
    num_mb = cfg.num_minibatches

    def build(cfg: ImpalaConfig):
        optimizer, schedule = make_optimizer(cfg, num_updates)

        def loss_fn(params, minibatch):
            return impala_loss(params, apply_fn, minibatch, cfg, axis_name)

        return optimizer, make_minibatch_step(optimizer, loss_fn, schedule, axis_name)

    optimizer, fixed_step = build(cfg)
    init = tunable_init(optimizer, cfg, tunable)

    def update_with(
        minibatch_step, state: TrainState, traj: Trajectory, keys: jax.Array
    ) -> tuple[TrainState, Metrics]:
        if num_mb == 1:  # one minibatch: no gather
            minibatches = jax.tree.map(lambda x: x[None], traj)
        else:
            envs = minibatch_envs(keys, num_mb, "impala.num_minibatches")
            minibatches = split_minibatches(traj, envs)
        flat, unravel = ravel_pytree(state.params)
        carry = (flat, state.opt_state, state.step * num_mb)
        (flat, opt_state, _), metrics = jax.lax.scan(
            minibatch_step(unravel), carry, minibatches, unroll=min(scan_unroll, num_mb)
        )
        return TrainState(unravel(flat), opt_state, state.step + 1), reduce_metrics(metrics)

    def update(state: TrainState, traj: Trajectory, keys: jax.Array) -> tuple[TrainState, Metrics]:
        if not tunable:
            return update_with(fixed_step, state, traj, keys)
        carried = state.opt_state
        _, minibatch_step = build(with_inputs(cfg, carried))
        state, metrics = update_with(
            minibatch_step, state._replace(opt_state=carried.opt), traj, keys
        )
        state = state._replace(opt_state=carried._replace(opt=state.opt_state))
        return state, {**metrics, **reported(carried)}

    return Algorithm(init=init, update=update)
