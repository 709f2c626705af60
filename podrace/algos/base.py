"""The algorithm contract shared by PPO and IMPALA (optax-style: pure functions in a NamedTuple)."""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax

from podrace.types import PyTree, Trajectory


class TrainState(NamedTuple):
    """Learner state; a pytree, replicated over the learner mesh."""

    params: PyTree
    opt_state: PyTree
    step: jax.Array
    """int32 scalar: learner updates applied so far (the params version)."""


class Algorithm(NamedTuple):
    """`update(state, traj, key)` runs inside shard_map on the local shard of `traj`.

    `key` is this shard's own raw uint32 key of shape (2,) (a (1, 2) block of a
    (num_shards, 2) array sharded over the mesh axis is accepted too). Metrics are
    scalars already reduced across shards.
    """

    init: Callable[[PyTree], TrainState]
    update: Callable[[TrainState, Trajectory, jax.Array], tuple[TrainState, dict[str, jax.Array]]]
