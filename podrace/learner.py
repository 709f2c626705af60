"""The learner: a mesh over the learner devices, the sharded update step, the learner loop.

The update is `jit(shard_map(...))` over the mesh axis `learner`: every shard sees its own
slice of the env axis and the random keys of exactly those envs (one key per env, sharded
like the data), and the algorithm combines gradients across shards. Because keys belong
to envs rather than to shards, the number of learner devices does not change the update. After each update the new params
are blocked on, checked finite, and only then published (version = updates applied).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from podrace.algos.base import Algorithm, TrainState
from podrace.algos.impala import make_impala
from podrace.algos.ppo import make_ppo
from podrace.config import TrainConfig
from podrace.control import Lifetime
from podrace.metrics.registry import Metrics
from podrace.pipeline import Pipeline
from podrace.sync.base import Publisher
from podrace.types import Trajectory

AXIS = "learner"

TRAJECTORY_SPEC = Trajectory(*(P(None, AXIS),) * 8, last_obs=P(AXIS), last_value=P(AXIS))


class NonFiniteUpdate(FloatingPointError):
    """The loss or gradients of an update were NaN/inf; those params are never published."""


class TooManySkippedUpdates(NonFiniteUpdate):
    """More updates were skipped as non-finite than the run allows (it is not training)."""


def make_algorithm(cfg: TrainConfig, apply_fn: Callable) -> Algorithm:
    """The configured algorithm, its collectives bound to the learner mesh axis."""
    make, algo_cfg = (make_ppo, cfg.ppo) if cfg.algo == "ppo" else (make_impala, cfg.impala)
    return make(algo_cfg, apply_fn, cfg.num_updates, AXIS, cfg.layout.scan_unroll)


def make_mesh(devices: Sequence[jax.Device]) -> Mesh:
    return Mesh(np.asarray(devices), (AXIS,))


def trajectory_shardings(mesh: Mesh) -> tuple[NamedSharding, NamedSharding]:
    """(sharding of [T, B, ...] leaves, sharding of [B, ...] leaves): split along envs."""
    return NamedSharding(mesh, P(None, AXIS)), NamedSharding(mesh, P(AXIS))


def env_keys(key: jax.Array, num_actors: int, envs_per_actor: int, mesh: Mesh) -> jax.Array:
    """One raw key per env, [num_actors * envs_per_actor, 2], sharded along the mesh axis.

    Env (actor a, env j) always gets key number a * envs_per_actor + j, in row
    j * num_actors + a: the column order of concat_actors, so every shard holds the keys of
    exactly its own envs.
    """
    order = [a * envs_per_actor + j for j in range(envs_per_actor) for a in range(num_actors)]
    keys = jax.random.split(key, num_actors * envs_per_actor)[np.asarray(order)]
    return jax.device_put(keys, NamedSharding(mesh, P(AXIS)))


class LearnerPlacement:
    """Splits an actor-device Trajectory along the env axis onto the learner devices.

    Each learner device receives only its own slice (one explicit device_put per device);
    the slices are then assembled into arrays sharded over the learner mesh, without ever
    replicating the whole batch.
    """

    def __init__(self, time_sharding: NamedSharding, env_sharding: NamedSharding):
        self.time_sharding = time_sharding  # for [T, B, ...] leaves: P(None, axis)
        self.env_sharding = env_sharding  # for [B, ...] leaves: P(axis)
        self.devices = list(time_sharding.mesh.devices.flat)
        n = len(self.devices)

        def split(traj: Trajectory):
            def cut(x, axis):
                return tuple(jnp.split(x, n, axis=axis))

            return Trajectory(
                *(cut(getattr(traj, f), 1) for f in Trajectory._fields[:8]),
                last_obs=cut(traj.last_obs, 0),
                last_value=cut(traj.last_value, 0),
            )

        self._split = jax.jit(split)

    def place(self, traj: Trajectory) -> Trajectory:
        pieces = self._split(traj)  # per field: tuple of n arrays on the actor device
        per_device = [
            jax.device_put(Trajectory(*(field[i] for field in pieces)), device)
            for i, device in enumerate(self.devices)
        ]

        def assemble(name: str, time_major: bool):
            shards = [getattr(t, name) for t in per_device]
            local = shards[0].shape
            axis = 1 if time_major else 0
            shape = local[:axis] + (local[axis] * len(shards),) + local[axis + 1 :]
            sharding = self.time_sharding if time_major else self.env_sharding
            return jax.make_array_from_single_device_arrays(shape, sharding, shards)

        return Trajectory(
            *(assemble(f, True) for f in Trajectory._fields[:8]),
            last_obs=assemble("last_obs", False),
            last_value=assemble("last_value", False),
        )


def concat_actors(trajs: Sequence[Trajectory]) -> Trajectory:
    """Interleave per-actor (local) trajectories along the env axis: env j of actor a is
    column j * num_actors + a. Each shard holds a slice of every actor's envs, so this
    global column order is the same for any number of learner devices."""

    def interleave(xs, axis):
        stacked = jnp.stack(xs, axis=axis + 1)
        return stacked.reshape(stacked.shape[:axis] + (-1,) + stacked.shape[axis + 2:])

    return Trajectory(*(
        interleave([getattr(t, f) for t in trajs], 0 if f in ("last_obs", "last_value") else 1)
        for f in Trajectory._fields
    ))


def make_update_fn(algo: Algorithm, mesh: Mesh, num_actors: int) -> Callable:
    """jit(shard_map(update)): (state, per-actor trajectories, env keys) -> (state, keys, metrics)."""

    def body(state: TrainState, trajs: tuple[Trajectory, ...], keys: jax.Array):
        split = jax.vmap(jax.random.split)(keys)  # [B_local, 2, 2]: next keys, this update's
        state, metrics = algo.update(state, concat_actors(trajs), split[:, 1])
        return state, split[:, 0], metrics

    sharded = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(P(), (TRAJECTORY_SPEC,) * num_actors, P(AXIS)),
        out_specs=(P(), P(AXIS), P()),
    )
    return jax.jit(sharded)


@dataclass(frozen=True)
class LearnerSettings:
    num_updates: int
    steps_per_update: int
    """Env steps consumed by one update (all actors together), for the `env_steps` counter."""
    skip_nonfinite: bool = False
    """Skip (and count) a non-finite update instead of failing the run."""
    max_skipped: int = 0
    """With skip_nonfinite: fail the run once more updates than this were skipped."""


class Learner:
    """Consumes one rollout per actor per update, updates, and publishes the new params.

    `update_fn(state, trajectories, keys) -> (state, keys, metrics)` is the jitted sharded
    step (or a fake); `pipeline.next_batch(version)` supplies rollouts already on the mesh.
    """

    def __init__(
        self,
        settings: LearnerSettings,
        state: TrainState,
        keys: jax.Array,
        update_fn: Callable,
        pipeline: Pipeline,
        publisher: Publisher,
        metrics: Metrics,
        lifetime: Lifetime,
        on_update: Callable[[int], None] | None = None,
    ):
        self.settings = settings
        self.skipped = 0
        metrics.count("learner/skipped_nonfinite", 0)  # present in every line, 0 included
        self.state = state
        self.keys = keys
        self.update_fn = update_fn
        self.pipeline = pipeline
        self.publisher = publisher
        self.metrics = metrics
        self.lifetime = lifetime
        self.on_update = on_update
        self.version = publisher.publish(state.params)

    def run(self) -> None:
        # From the first published version (0, or a resumed checkpoint's) to num_updates.
        for _ in range(self.settings.num_updates - self.version):
            self.lifetime.check()
            self.step()

    def step(self) -> None:
        rollouts, lag = self.pipeline.next_batch(self.version)
        start = time.perf_counter()
        trajs = tuple(r.trajectory for r in rollouts)
        state, keys, metrics = self.update_fn(self.state, trajs, self.keys)
        jax.block_until_ready(state.params)
        learner_step = time.perf_counter() - start
        metrics = jax.device_get(metrics)
        self.keys = keys
        if metrics.pop("finite"):
            self.state = state
        elif self.settings.skip_nonfinite:
            # Republish the old params under the next version so actors keep their pace.
            self.skipped += 1
            self.metrics.count("learner/skipped_nonfinite")
            if self.skipped > self.settings.max_skipped:
                raise TooManySkippedUpdates(
                    f"{self.skipped} of {self.settings.num_updates} updates skipped as non-finite, more than "
                    f"the {self.settings.max_skipped} that safety.max_skipped_fraction allows"
                )
            metrics = {}
        else:
            raise NonFiniteUpdate(
                f"non-finite loss or gradients in update {self.version + 1} "
                f"(loss={metrics.get('loss')}); params not published"
            )
        start = time.perf_counter()
        self.version = self.publisher.publish(self.state.params)
        publish = time.perf_counter() - start

        m = self.metrics
        m.add_many({f"learner/{k}": float(v) for k, v in metrics.items()})
        m.add_many({f"lag/{k}": v for k, v in lag.items() if k != "queue_get_wait"})
        m.add_many(
            {
                "learner/queue_get_wait": lag["queue_get_wait"],
                "learner/step": learner_step,
                "learner/publish": publish,
            }
        )
        m.set("lag/max_seen", max(m.last("lag/max_seen", 0.0), lag["lag_max"]))
        m.set("version", self.version)
        m.count("env_steps", self.settings.steps_per_update)
        for r in rollouts:
            m.add_values("episode/return", r.episode_returns)
            m.add_values("episode/length", r.episode_lengths)
            m.count("episodes", len(r.episode_returns))
        if self.on_update is not None:
            self.on_update(self.version)
