"""The algorithm contract shared by PPO and IMPALA (optax-style: pure functions in a NamedTuple)."""

from __future__ import annotations

from collections.abc import Callable
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
