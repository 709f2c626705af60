"""PPO (clipped surrogate) for the decoupled learner.

One update: GAE on the local shard with the behaviour values, then num_epochs passes of
num_minibatches optimizer steps. Minibatches are stratified by env: each env column
shuffles its own T time steps with its own key and deals T / num_minibatches of them to
every minibatch. A minibatch is thus the same set of samples however the envs are spread
over learner shards, and every mean and the advantage normalisation use global
(cross-shard) statistics, so 1, 2 or 4 learner devices compute the same update.

With a recurrent network a minibatch is whole env sequences instead, never cut across time:
each epoch deals the envs to the minibatches as IMPALA does (blocks of num_minibatches envs,
ranked by the envs' own keys, drawn again every epoch), and the loss unrolls the core over
each sequence from the state its rollout was stamped with (truncated backpropagation
through time over the rollout).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from podrace.algos.advantages import gae
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
from podrace.config import PPOConfig
from podrace.types import PyTree, Trajectory

ApplyFn = Callable[[PyTree, jax.Array], tuple]


class PPOBatch(NamedTuple):
    """Samples that one PPO minibatch step consumes: flat [N, ...] for a feed-forward
    network; for a recurrent one env sequences [T, b, ...] and their start states."""

    obs: jax.Array
    actions: jax.Array
    logprobs: jax.Array  # behaviour
    values: jax.Array  # behaviour
    advantages: jax.Array
    returns: jax.Array
    valid: jax.Array
    core_state: Any = ()
    """Recurrent: the core's state before each sequence's first step ([b, ...] per leaf)."""


def ppo_loss(
    params: PyTree,
    apply_fn: ApplyFn,
    minibatch: PPOBatch,
    cfg: PPOConfig,
    axis_name: str | None,
) -> tuple[jax.Array, Metrics]:
    """Returns (this shard's share of the loss, global metrics).

    psum of the share over shards (and of its gradient) is the masked-mean loss over the
    global minibatch; with axis_name=None the share is the loss itself.
    loss = policy_loss - ent_coef * entropy + vf_coef * value_loss.
    """
    if is_recurrent(apply_fn):
        dist, value, _ = apply_fn(params, minibatch.obs, minibatch.valid, minibatch.core_state)
    else:
        dist, value = apply_fn(params, minibatch.obs)
    logp = dist.log_prob(minibatch.actions)
    log_ratio = logp - minibatch.logprobs
    ratio = jnp.exp(log_ratio)
    masked = MaskedMean(minibatch.valid, axis_name)

    adv = minibatch.advantages
    if cfg.norm_adv:
        adv_mean = masked.mean(adv)
        adv_std = jnp.sqrt(masked.mean(jnp.square(adv - adv_mean)))
        adv = (adv - adv_mean) / (adv_std + 1e-8)

    clipped_ratio = jnp.clip(ratio, 1.0 - cfg.clip_coef, 1.0 + cfg.clip_coef)
    policy = jnp.maximum(-adv * ratio, -adv * clipped_ratio)

    returns = minibatch.returns
    value_err = jnp.square(value - returns)
    if cfg.clip_value_loss:
        value_clipped = minibatch.values + jnp.clip(
            value - minibatch.values, -cfg.clip_coef, cfg.clip_coef
        )
        value_err = jnp.maximum(value_err, jnp.square(value_clipped - returns))

    shares = {
        "policy_loss": masked.share(policy),
        "value_loss": masked.share(0.5 * value_err),
        "entropy": masked.share(dist.entropy()),
    }
    loss = (
        shares["policy_loss"]
        - cfg.ent_coef * shares["entropy"]
        + cfg.vf_coef * shares["value_loss"]
    )
    stats = {
        **shares,
        "loss": loss,
        "approx_kl": masked.share((ratio - 1.0) - log_ratio),
        "clip_frac": masked.share((jnp.abs(ratio - 1.0) > cfg.clip_coef).astype(jnp.float32)),
    }
    return loss, jax.lax.stop_gradient(psum(stats, axis_name))


def make_ppo(
    cfg: PPOConfig,
    apply_fn: ApplyFn,
    num_updates: int,
    axis_name: str | None,
    scan_unroll: int = 1,
    tunable: Sequence[str] = (),
) -> Algorithm:
    """PPO as an Algorithm; `apply_fn(params, obs) -> (dist, value)`.

    Adam (eps 1e-5) after global-norm clipping; the learning rate optionally decays
    linearly to 0 over num_updates * num_epochs * num_minibatches optimizer steps.

    `tunable` names PPOConfig fields (learning_rate, ent_coef, clip_coef, gamma,
    gae_lambda) that are inputs of the update instead of constants of its program: they
    ride in the optimizer state (`podrace.algos.tunable.Tuned`) and are reported as
    `hp/<name>` metrics. Without them the program is the one it always was.
    """
    steps_per_update = cfg.num_epochs * cfg.num_minibatches

    def build(cfg: PPOConfig):
        schedule = learning_rate_schedule(
            cfg.learning_rate, cfg.anneal_lr, num_updates * steps_per_update
        )
        optimizer = optax.chain(
            optax.clip_by_global_norm(cfg.max_grad_norm),
            optax.adam(schedule, eps=1e-5),
        )

        def loss_fn(params, minibatch):
            return ppo_loss(params, apply_fn, minibatch, cfg, axis_name)

        return optimizer, make_minibatch_step(optimizer, loss_fn, schedule, axis_name)

    optimizer, fixed_step = build(cfg)
    init = tunable_init(optimizer, cfg, tunable)

    recurrent = is_recurrent(apply_fn)

    def recurrent_epochs(
        cfg: PPOConfig, minibatch_step, state: TrainState, batch: PPOBatch, keys: jax.Array
    ):
        """The epochs on whole env sequences: [T, B, ...] -> [num_mb, T, B / num_mb, ...]."""
        num_mb = cfg.num_minibatches
        flat, unravel = ravel_pytree(state.params)
        step = minibatch_step(unravel)

        def epoch(carry, epoch_index):
            if num_mb == 1:  # one minibatch: the order cannot matter, skip the gather
                data = jax.tree.map(lambda x: x[None], batch)
            else:
                epoch_keys = jax.vmap(lambda k: jax.random.fold_in(k, epoch_index))(keys)
                envs = minibatch_envs(epoch_keys, num_mb, "ppo.num_minibatches")
                data = PPOBatch(
                    *(take_envs(x, envs, 1) for x in batch[:-1]),
                    core_state=jax.tree.map(lambda x: take_envs(x, envs, 0), batch.core_state),
                )
            return jax.lax.scan(step, carry, data, unroll=min(scan_unroll, num_mb))

        carry = (flat, state.opt_state, state.step * steps_per_update)
        (flat, opt_state, _), metrics = jax.lax.scan(
            epoch, carry, jnp.arange(cfg.num_epochs), unroll=min(scan_unroll, cfg.num_epochs)
        )
        return TrainState(unravel(flat), opt_state, state.step + 1), reduce_metrics(metrics)

    def update_with(
        cfg: PPOConfig, minibatch_step, state: TrainState, traj: Trajectory, keys: jax.Array
    ) -> tuple[TrainState, Metrics]:
        advantages, returns = gae(
            traj.rewards,
            traj.values,
            traj.last_value,
            traj.terminated,
            traj.truncated,
            traj.valid,
            cfg.gamma,
            cfg.gae_lambda,
        )
        batch = PPOBatch(
            traj.obs, traj.actions, traj.logprobs, traj.values, advantages, returns, traj.valid
        )
        num_steps, num_envs = batch.valid.shape
        num_mb = cfg.num_minibatches
        if recurrent:
            return recurrent_epochs(
                cfg, minibatch_step, state, batch._replace(core_state=traj.core_state), keys
            )
        if num_steps % num_mb:
            raise ValueError(
                f"ppo.num_minibatches ({num_mb}) must divide the rollout length ({num_steps})"
            )
        columns = jnp.arange(num_envs)
        flat, unravel = ravel_pytree(state.params)
        step = minibatch_step(unravel)

        def epoch(carry, epoch_index):
            data = batch
            if num_mb > 1:  # with one minibatch the order cannot matter: skip the gather
                order = jax.vmap(
                    lambda k: jax.random.permutation(jax.random.fold_in(k, epoch_index), num_steps)
                )(keys)
                data = jax.tree.map(lambda x: x[order.T, columns], data)
            # [T, B, ...] -> [num_mb, T / num_mb * B, ...]: minibatch m takes rows m*T/num_mb...
            data = jax.tree.map(lambda x: x.reshape((num_mb, -1) + x.shape[2:]), data)
            return jax.lax.scan(step, carry, data, unroll=min(scan_unroll, num_mb))

        carry = (flat, state.opt_state, state.step * steps_per_update)
        (flat, opt_state, _), metrics = jax.lax.scan(
            epoch, carry, jnp.arange(cfg.num_epochs), unroll=min(scan_unroll, cfg.num_epochs)
        )
        return TrainState(unravel(flat), opt_state, state.step + 1), reduce_metrics(metrics)

    def update(state: TrainState, traj: Trajectory, keys: jax.Array) -> tuple[TrainState, Metrics]:
        if not tunable:
            return update_with(cfg, fixed_step, state, traj, keys)
        carried = state.opt_state
        inputs = with_inputs(cfg, carried)
        _, minibatch_step = build(inputs)
        state, metrics = update_with(
            inputs, minibatch_step, state._replace(opt_state=carried.opt), traj, keys
        )
        state = state._replace(opt_state=carried._replace(opt=state.opt_state))
        return state, {**metrics, **reported(carried)}

    return Algorithm(init=init, update=update)
