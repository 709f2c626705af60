"""The algorithm contract shared by PPO and IMPALA (optax-style: pure functions in a NamedTuple)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import jax

from podrace.types import PyTree, Trajectory


class TrainState(NamedTuple):
    """Learner state; a pytree, replicated over the learner mesh."""

    params: PyTree
    opt_state: PyTree
    step: jax.Array
    """int32 scalar: learner updates applied so far (the params version)."""


class Algorithm(NamedTuple):
    """`update(state, traj, keys)` runs inside shard_map on the local shard of `traj`.

    `keys` are raw uint32 keys of shape (B_local, 2): one per env column of the local
    shard, sharded exactly like the data. Every shard therefore draws from its own keys,
    and because a column's key belongs to its env (not to the shard), the randomness of
    an update does not depend on how many learner devices share the batch. Metrics are
    scalars already reduced across shards.
    """

    init: Callable[[PyTree], TrainState]
    update: Callable[[TrainState, Trajectory, jax.Array], tuple[TrainState, dict[str, jax.Array]]]


@dataclass(frozen=True)
class RecurrentApply:
    """The `apply` of a network with a recurrent core, where a feed-forward network's is
    `apply(params, obs) -> (dist, value)`.

    `apply(params, obs, valid, state) -> (dist, value, states)` runs the core over
    obs [T, B, ...] from `state` (the core's state before step 0, [B, ...] per leaf):
    dist and value are [T, B], `states` the core's state after each step ([T, B, ...] per
    leaf; the last is the state the next step starts from). `valid` [T, B] is the
    trajectory's mask: the state after an invalid (autoreset) step is the initial state, so
    the first step of every episode starts from it (`podrace.networks.recurrent`).
    Actors step it with T = 1, learners unroll it over whole rollouts."""

    unroll: Callable
    initial_state: Callable[[int], PyTree]
    """batch size -> the core's initial (zero) state for that many envs."""

    def __call__(self, params: PyTree, obs: jax.Array, valid: jax.Array, state: PyTree):
        return self.unroll(params, obs, valid, state)


def is_recurrent(apply_fn: Callable) -> bool:
    """Whether `apply_fn` is a recurrent network's (`RecurrentApply`)."""
    return isinstance(apply_fn, RecurrentApply)
