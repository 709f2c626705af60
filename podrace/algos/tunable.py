"""Hyperparameters as inputs of the update, for a population (PBT) to change them without
recompiling: they ride in the optimizer's state as float32 arrays (as
`optax.inject_hyperparams` keeps a learning rate), so they are checkpointed with the learner
state, copied with it when a member exploits another, and replaced in place to explore."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from podrace.algos.base import TrainState
from podrace.algos.common import init_state
from podrace.types import PyTree

C = TypeVar("C")


class Tuned(NamedTuple):
    """The optimizer state of an algorithm whose `hyperparameters` are update inputs."""

    opt: PyTree
    hyperparameters: dict[str, jax.Array]
    """float32 scalars, under the algorithm config's field names."""


def tuned(opt_state: PyTree, cfg: Any, names: Sequence[str]) -> Tuned:
    """`opt_state` with `cfg`'s values of `names` as the update's starting inputs."""
    return Tuned(opt_state, {name: jnp.asarray(getattr(cfg, name), jnp.float32) for name in names})


def with_inputs(cfg: C, state: Tuned) -> C:
    """`cfg` with the hyperparameters `state` carries (traced arrays inside the update)."""
    return dataclasses.replace(cfg, **state.hyperparameters)


def reported(state: Tuned) -> dict[str, jax.Array]:
    """The carried hyperparameters as update metrics (`hp/<name>`)."""
    return {f"hp/{name}": value for name, value in state.hyperparameters.items()}


def replaced(opt_state: Tuned, values: dict[str, float]) -> Tuned:
    """`opt_state` with `values` (host floats) for its hyperparameters, each keeping its
    array's placement (an explicit transfer: the learner runs under a transfer guard)."""
    hyperparameters = {
        name: jax.device_put(np.float32(values[name]), old.sharding)
        for name, old in opt_state.hyperparameters.items()
    }
    return opt_state._replace(hyperparameters=hyperparameters)


__all__ = ["Tuned", "replaced", "reported", "tuned", "with_inputs"]


def tunable_init(optimizer: Any, cfg: Any, names: Sequence[str]) -> Any:
    """`init` of an Algorithm whose hyperparameters `names` are inputs of its update: the
    optimizer's state at update 0 carries them (`tuned`); with no names, `init_state`'s."""
    fresh = init_state(optimizer)
    if not names:
        return fresh

    def init(params: PyTree) -> TrainState:
        state = fresh(params)
        return state._replace(opt_state=tuned(state.opt_state, cfg, names))

    return init
