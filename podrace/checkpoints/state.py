"""What a checkpoint holds: the state of a run that must survive a stop.

The parts come from the run's components, each saying what it saves (Acme's `Saveable`
is the model): the learner its train state, keys, normalizer statistics and skip count
(`Learner.saved`), the fleet its actors' start keys, next sequence numbers and restart
counts (`Fleet.save`), the run its counters and clock. A restored `RunState` goes back
the same way: the learner is built from it, the fleet decides where its actors continue
(`Fleet.restore`), the run's counters continue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from podrace.algos.base import TrainState
from podrace.algos.normalizer import init_normalizer
from podrace.config import TrainConfig
from podrace.learner_mesh import make_algorithm
from podrace.networks import make_network
from podrace.types import EnvSpec, PyTree

CHECKPOINT_DIR = "checkpoints"


@dataclass(frozen=True)
class RunState:
    """The state of a run that must survive a stop; one checkpoint holds exactly this."""

    train_state: TrainState
    """Params, optimizer state and update count (the learning-rate schedule reads it)."""
    learner_keys: Any
    """Raw uint32 learner keys, one per env: [num_actors * num_envs, 2]."""
    actor_keys: Any
    """Raw uint32 key each actor (of every process) started the run with: [actors, 2]."""
    actor_next_seq: tuple[int, ...]
    """Sequence number of the next rollout of every actor."""
    version: int
    """Params version (= learner updates applied); also the checkpoint's step."""
    env_steps: int
    episodes: int
    normalizer: PyTree | None = None
    """Observation/return normalizer statistics; None while podrace has none."""
    time_s: float = 0.0
    """Training seconds (metrics' `time_s`) when the state was taken: a resumed run's clock
    continues from here."""
    skipped_updates: int = 0
    """Updates skipped as non-finite so far (the run's skip budget spans its resumes)."""
    actor_restarts: tuple[int, ...] = ()
    """How often each actor was restarted (Ray workers; () or zeros for threads)."""
    counters: dict[str, float] = field(default_factory=dict)
    """This process's running totals (`Metrics.count`: env steps, episodes, restarts, lost
    credits, ...) when the state was taken: a resumed run's continue from here. Each
    process of a multi-host run keeps its own (`Writers.every_process`)."""

    def arrays(self) -> dict:
        tree = {
            "train_state": self.train_state,
            "learner_keys": self.learner_keys,
            "actor_keys": self.actor_keys,
        }
        if self.normalizer is not None:
            tree["normalizer"] = self.normalizer
        return tree


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def spec_json(spec: EnvSpec) -> dict:
    """The parts of an EnvSpec a network's shapes depend on, as JSON."""
    return {
        "obs_shape": list(spec.obs_shape),
        "obs_dtype": np.dtype(spec.obs_dtype).name,
        "num_actions": spec.num_actions,
        "action_shape": list(spec.action_shape),
    }


def abstract_run_state(cfg: TrainConfig, spec: EnvSpec) -> RunState:
    """Shapes and dtypes of a run's RunState (no arrays are computed): a restore template.
    The keys and normalizer statistics are those of every process's actors and envs (a
    multi-host checkpoint holds every process's; its stored config names the count)."""
    network = make_network(cfg.network, spec)
    obs = jax.ShapeDtypeStruct((1,) + tuple(spec.obs_shape), spec.obs_dtype)
    params = jax.eval_shape(network.init, jax.random.PRNGKey(0), obs)
    train_state = jax.eval_shape(make_algorithm(cfg, network.apply).init, params)

    def keys(n: int) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((n, 2), jnp.uint32)

    n = cfg.num_actors * (cfg.distributed.num_processes or 1)
    normalizer = jax.eval_shape(
        lambda: init_normalizer(cfg.normalize, spec.obs_shape, n * cfg.env.num_envs)
    )
    return RunState(train_state, keys(n * cfg.env.num_envs), keys(n), (0,) * n, 0, 0, 0, normalizer)


__all__ = ["CHECKPOINT_DIR", "RunState", "abstract_run_state", "checkpoint_dir", "spec_json"]
