"""Pieces shared by PPO and IMPALA: cross-shard reductions and one synchronised SGD step.

Every loss is written as "this shard's share": a masked sum divided by the GLOBAL count
of valid samples, so that psum over shards of the share (and of its gradient) is exactly
the single-device masked mean over the whole batch. `axis_name=None` means no mesh
(plain single-device use, e.g. in tests): every reduction is then the identity.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from podrace.algos.base import TrainState
from podrace.types import PyTree

Metrics = dict[str, jax.Array]


def psum(tree: PyTree, axis_name: str | None) -> PyTree:
    """Sum over the learner mesh axis (identity without a mesh)."""
    return tree if axis_name is None else jax.lax.psum(tree, axis_name)


def to_varying(tree: PyTree, axis_name: str | None) -> PyTree:
    """Mark replicated leaves as per-shard so that jax.grad returns LOCAL gradients.

    Under shard_map with check_vma=True, the gradient w.r.t. a replicated (invariant)
    input is psum'd implicitly; with check_vma=False it is not. Casting first makes both
    modes return local gradients, which we then psum explicitly exactly once.
    """
    if axis_name is None:
        return tree

    def cast(x):
        if axis_name in getattr(jax.typeof(x), "vma", frozenset()):
            return x
        return jax.lax.pcast(x, axis_name, to="varying")

    return jax.tree.map(cast, tree)


class MaskedMean:
    """Shard-local share of a masked mean whose denominator is the global valid count."""

    def __init__(self, valid: jax.Array, axis_name: str | None):
        self.valid = valid.astype(bool)
        count = psum(jnp.sum(self.valid, dtype=jnp.float32), axis_name)
        self.count = jnp.maximum(count, 1.0)
        self.axis_name = axis_name

    def local_sum(self, x: jax.Array) -> jax.Array:
        """sum over this shard of valid x (psum of local sums = the global masked sum)."""
        return jnp.sum(jnp.where(self.valid, x, 0.0))

    def share(self, x: jax.Array) -> jax.Array:
        """sum over this shard of valid x / global count (psum of shares = global mean)."""
        return self.local_sum(x) / self.count

    def mean(self, x: jax.Array) -> jax.Array:
        """The global masked mean, identical on every shard."""
        return psum(self.share(x), self.axis_name)


def learning_rate_schedule(
    lr: float, anneal: bool, total_steps: int, hold: int = 1
) -> optax.Schedule:
    """Constant, or linear decay to 0 over `total_steps` optimizer steps.

    With `hold` = k the rate changes only every k steps (lr * (1 - (count // k) * k /
    total_steps)): one value per update when k is the optimizer steps per update.
    """
    if not anneal:
        return optax.constant_schedule(lr)
    linear = optax.linear_schedule(lr, 0.0, transition_steps=max(1, total_steps))
    return linear if hold == 1 else (lambda count: linear(count // hold * hold))


LossFn = Callable[[PyTree, PyTree], tuple[jax.Array, Metrics]]


def sgd_step(
    optimizer: optax.GradientTransformation,
    loss_fn: LossFn,
    params: PyTree,
    opt_state: PyTree,
    batch: PyTree,
    axis_name: str | None,
) -> tuple[PyTree, PyTree, Metrics]:
    """One optimizer step on the global gradient (psum of local shares).

    `loss_fn(params, batch) -> (local share of the loss, metrics)` where metrics are
    already global and include "loss". Clipping inside `optimizer` therefore sees the
    global gradient, and all shards apply the identical update.
    """
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (_, metrics), grads = grad_fn(to_varying(params, axis_name), batch)
    grads = psum(grads, axis_name)
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    # A non-finite gradient element makes the global norm non-finite, so one scalar check
    # covers the whole gradient tree.
    finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
    return params, opt_state, {**metrics, "grad_norm": grad_norm, "finite": finite}


def reduce_metrics(stacked: Metrics) -> Metrics:
    """Average per-minibatch metrics; `finite` is True only if every step was finite."""
    out = {k: jnp.mean(v) for k, v in stacked.items() if k != "finite"}
    out["finite"] = jnp.all(stacked["finite"])
    return out


def init_state(optimizer: optax.GradientTransformation) -> Callable[[PyTree], TrainState]:
    """`init` of an Algorithm: params -> TrainState at update 0. The optimizer's state is
    that of the params raveled into one vector, as the minibatch steps see them."""

    def init(params: PyTree) -> TrainState:
        return TrainState(params, optimizer.init(ravel_pytree(params)[0]), jnp.zeros((), jnp.int32))

    return init


def make_minibatch_step(optimizer, loss_fn, schedule, axis_name: str | None) -> Callable:
    """`bind(unravel)` -> one scanned optimizer step on raveled params: carry (flat params,
    opt_state, opt_count) -> metrics with lr; `unravel` turns the vector back into the params
    pytree that `loss_fn` takes (`ravel_pytree(state.params)`).

    Why one vector: on XLA:CPU every array an update takes in or gives back costs time, and
    on a 2-core machine the learner thread's GIL hand-offs too (each array freed releases
    and retakes it). Per-leaf optimizer state would be 2 arrays per params leaf (Adam's moments);
    raveled it is 2 in all, and the optimizer's elementwise work is one fused op per step
    instead of several per leaf."""

    def bind(unravel: Callable[[jax.Array], PyTree]) -> Callable:
        def flat_loss(flat, minibatch):
            return loss_fn(unravel(flat), minibatch)

        def minibatch_step(carry, minibatch):
            flat, opt_state, opt_count = carry
            flat, opt_state, metrics = sgd_step(
                optimizer, flat_loss, flat, opt_state, minibatch, axis_name
            )
            metrics["learning_rate"] = jnp.asarray(schedule(opt_count), jnp.float32)
            return (flat, opt_state, opt_count + 1), metrics

        return minibatch_step

    return bind


def minibatch_envs(keys: jax.Array, num_mb: int, what: str) -> jax.Array:
    """[num_mb, B / num_mb] local env indices: row m lists the envs of minibatch m.

    Each block of num_mb consecutive envs deals one env to every minibatch, ranked by a
    uniform draw from each env's own key. The learner lays envs out in the same global order
    for any number of learner devices and a block never straddles two shards, so the
    minibatches do not depend on the learner count. `what` names the setting in the error.
    """
    num_envs = keys.shape[0]
    if num_envs % num_mb:
        raise ValueError(f"{what} ({num_mb}) must divide the envs per shard ({num_envs})")
    draws = jax.vmap(jax.random.uniform)(keys).reshape(num_envs // num_mb, num_mb)
    blocks = num_mb * jnp.arange(num_envs // num_mb)[:, None]
    return (jnp.argsort(draws, axis=1) + blocks).T


def take_envs(x: jax.Array, envs: jax.Array, axis: int) -> jax.Array:
    """`x`'s envs (along `axis`) by minibatch: envs [num_mb, b] -> [num_mb, ...] with `x`'s
    axes, the env axis b long ([T, B, ...] -> [num_mb, T, b, ...]; [B, ...] -> [num_mb, b, ...])."""
    return jnp.moveaxis(jnp.take(x, envs, axis=axis), axis, 0)
