"""A learner's sharded update built as a run builds it, for the learner tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from podrace.config import TrainConfig
from podrace.envs import env_spec
from podrace.learner_mesh import (
    LearnerPlacement,
    make_algorithm,
    make_mesh,
    make_update_fn,
    trajectory_shardings,
)
from podrace.networks import make_network
from podrace.types import EnvSpec


@dataclass
class ShardedUpdate:
    spec: EnvSpec
    mesh: jax.sharding.Mesh
    state: Any
    """The algorithm's initial state, replicated over the mesh."""
    update: Callable
    placement: LearnerPlacement


def sharded_update(cfg: TrainConfig, devices: Sequence[jax.Device], actors: int) -> ShardedUpdate:
    """`cfg`'s network and algorithm on a learner mesh of `devices`, its params initialized
    from key 0, and the update of `actors` actors' rollouts."""
    spec = env_spec(cfg.env)
    network = make_network(cfg.network, spec)
    mesh = make_mesh(devices)
    replicated = jax.sharding.NamedSharding(mesh, P())
    params = jax.jit(network.init, out_shardings=replicated)(
        jax.random.PRNGKey(0), np.zeros((1,) + spec.obs_shape, np.float32)
    )
    algo = make_algorithm(cfg, network.apply)
    state = jax.jit(algo.init, out_shardings=replicated)(params)
    placement = LearnerPlacement(*trajectory_shardings(mesh))
    return ShardedUpdate(spec, mesh, state, make_update_fn(algo, mesh, actors), placement)
