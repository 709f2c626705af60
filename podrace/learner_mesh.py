"""The learner devices' mesh and the programs sharded over it.

The update is `jit(shard_map(...))` over the mesh axis `learner`: every shard sees its own
slice of the env axis and the random keys of exactly those envs (one key per env, sharded
like the data), and the algorithm combines gradients across shards. Because keys belong
to envs rather than to shards, the number of learner devices does not change the update.
Rollouts reach the mesh through `LearnerPlacement`; values every process holds (keys, the
normalizer) through `global_array`. The loop that runs these programs is `podrace.learner`.
"""

from __future__ import annotations

import functools
import os
from collections import Counter
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from podrace.algos.base import Algorithm, TrainState
from podrace.algos.impala import make_impala
from podrace.algos.normalization import ReturnTracker, RunningStats
from podrace.algos.normalizer import Normalizer, normalize_batch
from podrace.algos.ppo import make_ppo
from podrace.config import NetworkConfig, NormalizeConfig, TrainConfig
from podrace.sync.placement import on_device, place
from podrace.types import Trajectory

AXIS = "learner"

TIME_MAJOR = Trajectory._fields[:8]
"""Trajectory fields laid out [T, B, ...]; the others (last_obs, last_value, core_state) are
[B, ...] per leaf."""


def env_axis(field: str) -> int:
    """The env axis of a Trajectory field's leaves."""
    return 1 if field in TIME_MAJOR else 0


TRAJECTORY_SPEC = Trajectory(
    *(P(None, AXIS),) * 8, last_obs=P(AXIS), last_value=P(AXIS), core_state=P(AXIS)
)


def make_algorithm(cfg: TrainConfig, apply_fn: Callable) -> Algorithm:
    """The configured algorithm, its collectives bound to the learner mesh axis; a member
    of a population (`pbt.population` > 1) takes the hyperparameters the population changes
    as inputs of its update."""
    make, algo_cfg = (make_ppo, cfg.ppo) if cfg.algo == "ppo" else (make_impala, cfg.impala)
    # A population's members take the hyperparameters it changes as update inputs.
    tunable = cfg.pbt.mutated(cfg.algo) if cfg.pbt.population > 1 else ()
    return make(algo_cfg, apply_fn, cfg.num_updates, AXIS, cfg.layout.scan_unroll, tunable)


def make_mesh(devices: Sequence[jax.Device]) -> Mesh:
    return Mesh(np.asarray(devices), (AXIS,))


def trajectory_shardings(mesh: Mesh) -> tuple[NamedSharding, NamedSharding]:
    """(sharding of [T, B, ...] leaves, sharding of [B, ...] leaves): split along envs."""
    return NamedSharding(mesh, P(None, AXIS)), NamedSharding(mesh, P(AXIS))


def global_array(value: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """`value` (held whole by every process) as one array with `sharding`: each process
    places only the slices of its own devices, so this works over a multi-process mesh."""
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def env_keys(key: jax.Array, num_actors: int, envs_per_actor: int, mesh: Mesh) -> jax.Array:
    """One raw key per env of every process, [processes * num_actors * envs_per_actor, 2],
    sharded along the mesh axis; `num_actors` counts the actors of one process.

    Env j of actor a of process p is global env g = (p * num_actors + a) * envs_per_actor + j
    and always gets key number g, however the mesh is split over processes and devices.
    Rows are laid out in the order the learner shards see their columns (each shard: its
    slice of every local actor's envs, interleaved as concat_actors does: env j of actor a
    at column j * num_actors + a), so each shard holds the keys of exactly its own envs.
    Each process places only the rows of its own devices.
    """
    devices = list(mesh.devices.flat)
    per_process = Counter(d.process_index for d in devices)
    local_shards = per_process[devices[0].process_index]
    if set(per_process.values()) != {local_shards}:
        raise ValueError(
            f"every process needs the same number of learner devices, got {dict(per_process)}"
        )
    per_shard = envs_per_actor // local_shards
    order = []
    rank: Counter = Counter()
    for device in devices:
        p, d = device.process_index, rank[device.process_index]
        rank[p] += 1
        order += [
            (p * num_actors + a) * envs_per_actor + j
            for j in range(d * per_shard, (d + 1) * per_shard)
            for a in range(num_actors)
        ]
    total = len(per_process) * num_actors * envs_per_actor
    keys = np.asarray(jax.device_get(jax.random.split(key, total)))[np.asarray(order)]
    return global_array(keys, NamedSharding(mesh, P(AXIS)))


class LearnerPlacement:
    """Splits an actor-device Trajectory along the env axis onto the learner devices.

    Each learner device receives only its own slice (one explicit device_put per device);
    the slices are then assembled into arrays sharded over the learner mesh, without ever
    replicating the whole batch.
    """

    def __init__(self, time_sharding: NamedSharding, env_sharding: NamedSharding):
        self.time_sharding = time_sharding  # for [T, B, ...] leaves: P(None, axis)
        self.env_sharding = env_sharding  # for [B, ...] leaves: P(axis)
        mesh = time_sharding.mesh
        # This process's learner devices, in mesh order; other processes feed the rest.
        self.devices = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
        self.num_shards = mesh.devices.size
        n = len(self.devices)

        def split(traj: Trajectory) -> tuple[Trajectory, ...]:
            """The n slices of `traj` along its env axis, one Trajectory each."""
            slices: list[dict] = [{} for _ in range(n)]
            for name in Trajectory._fields:
                leaves, tree = jax.tree.flatten(getattr(traj, name))
                cuts = [jnp.split(x, n, axis=env_axis(name)) for x in leaves]
                for i, part in enumerate(slices):
                    part[name] = tree.unflatten([cut[i] for cut in cuts])
            return tuple(Trajectory(**part) for part in slices)

        self._split = jax.jit(split)
        self._whole = Trajectory(
            *(time_sharding,) * 8,
            last_obs=env_sharding,
            last_value=env_sharding,
            core_state=env_sharding,
        )

    def place(self, traj: Trajectory) -> Trajectory:
        if self.num_shards == 1:
            # One learner device. A rollout made there (a CPU actor sharing the learner's
            # device) goes as it is: jax.device_put costs about 25 us per leaf even when
            # nothing moves, a third of a millisecond per CartPole rollout.
            if on_device(traj, self.devices[0]):
                return place(traj, self.devices[0])
            return place(traj, self._whole)
        pieces = self._split(traj)  # n slices on the actor device
        per_device = [place(pieces[i], device) for i, device in enumerate(self.devices)]

        def assemble(name: str, *shards: jax.Array) -> jax.Array:
            local, axis = shards[0].shape, env_axis(name)
            shape = local[:axis] + (local[axis] * self.num_shards,) + local[axis + 1 :]
            sharding = self.time_sharding if name in TIME_MAJOR else self.env_sharding
            return jax.make_array_from_single_device_arrays(shape, sharding, list(shards))

        return Trajectory(
            **{
                name: jax.tree.map(
                    functools.partial(assemble, name), *(getattr(t, name) for t in per_device)
                )
                for name in Trajectory._fields
            }
        )


def concat_actors(trajs: Sequence[Trajectory]) -> Trajectory:
    """Interleave per-actor (local) trajectories along the env axis: env j of actor a is
    column j * num_actors + a. Each shard holds a slice of every actor's envs, so this
    global column order is the same for any number of learner devices."""

    def interleave(xs, axis):
        stacked = jnp.stack(xs, axis=axis + 1)
        return stacked.reshape(stacked.shape[:axis] + (-1,) + stacked.shape[axis + 2 :])

    return Trajectory(
        *(
            jax.tree.map(
                lambda *xs, f=f: interleave(xs, env_axis(f)), *(getattr(t, f) for t in trajs)
            )
            for f in Trajectory._fields
        )
    )


class UpdateFn:
    """The jitted, sharded update; its metrics come back to the host as one array.

    A dict of scalars fetched as such costs one device->host copy per metric, on the
    learner's critical path after every update; packed, it is one copy. Calling returns
    (state, keys, {metric: NumPy scalar}) once the update has run (the metrics are its last
    output). `jitted` is the step itself, for lowering."""

    def __init__(self, jitted: Callable, names: list[str]):
        self.jitted = jitted
        self._names = names  # filled in when `jitted` is traced

    def __call__(self, state: TrainState, trajs: tuple[Trajectory, ...], keys: jax.Array):
        state, keys, packed = self.jitted(state, trajs, keys)
        return state, keys, dict(zip(self._names, np.asarray(jax.device_get(packed))))


SMALL_MLP_WIDTH = 128
"""Widest MLP layer the memory-optimized schedule is used for (see `learner_compiler_options`)."""

USER_SCHEDULER_FLAGS = (
    "--xla_cpu_scheduler_type",
    "--xla_cpu_enable_concurrency_optimized_scheduler",
)


def learner_compiler_options(network: NetworkConfig, mesh: Mesh) -> dict[str, str] | None:
    """XLA options for the learner's programs: the memory-optimized scheduler for a small MLP
    network on CPU, else none (XLA's defaults).

    XLA:CPU runs a program's independent ops (the actor and critic MLPs, each layer's weight
    and input gradients) concurrently on one intra-op thread pool that every program of the
    process shares, so the actors' compiled rollouts wait behind the learner's tasks there.
    The memory-optimized schedule reuses buffers across those branches and runs the update
    mostly as one chain, with bit-identical results: a small MLP's update takes less CPU
    and wall-clock (`cartpole-ppo`'s 64 x 64: a quarter less CPU on 2 cores), so the actors'
    rollouts wait less (`benchmarks/learner_update.py`, `benchmarks/cartpole_ppo.py`).
    Bigger ops gain from the concurrency (128-wide layers run as fast either way, 256-wide
    ones 10-20% slower scheduled for memory, `atari-ppo`'s convolutional update about a
    tenth slower), so they keep XLA's default. A scheduler chosen in XLA_FLAGS is the
    user's and stays."""
    if network.torso != "mlp" or max(network.hidden_sizes, default=0) > SMALL_MLP_WIDTH:
        return None
    if mesh.devices.flat[0].platform != "cpu":
        return None
    if any(flag in os.environ.get("XLA_FLAGS", "") for flag in USER_SCHEDULER_FLAGS):
        return None
    return {"xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"}


def make_update_fn(
    algo: Algorithm, mesh: Mesh, num_actors: int, compiler_options: dict[str, str] | None = None
) -> UpdateFn:
    """jit(shard_map(update)): (state, per-actor trajectories, env keys) -> (state, keys, metrics);
    compiled with `compiler_options` (see `learner_compiler_options`)."""
    names: list[str] = []

    def body(state: TrainState, trajs: tuple[Trajectory, ...], keys: jax.Array):
        split = jax.vmap(jax.random.split)(keys)  # [B_local, 2, 2]: next keys, this update's
        state, metrics = algo.update(state, concat_actors(trajs), split[:, 1])
        names[:] = sorted(metrics)
        packed = jnp.stack([jnp.asarray(metrics[name], jnp.float32) for name in names])
        return state, split[:, 0], packed

    sharded = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(P(), (TRAJECTORY_SPEC,) * num_actors, P(AXIS)),
        out_specs=(P(), P(AXIS), P()),
    )
    return UpdateFn(jax.jit(sharded, compiler_options=compiler_options), names)


def normalizer_specs(normalizer: Normalizer) -> Normalizer:
    """Statistics replicated, the per-env return tracker split along envs like the data."""
    return Normalizer(
        obs=None if normalizer.obs is None else P(),
        returns=None if normalizer.returns is None else P(),
        tracker=None if normalizer.tracker is None else ReturnTracker(P(AXIS)),
    )


def place_normalizer(normalizer: Normalizer, mesh: Mesh) -> Normalizer:
    """The normalizer on the learner mesh as global arrays (`global_array`: its return
    tracker has one entry per env of every process). A device_put of this process's arrays
    onto a multi-process mesh built arrays no program could use."""
    shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), normalizer_specs(normalizer))
    host = jax.device_get(normalizer)
    return jax.tree.map(
        lambda sharding, part: jax.tree.map(lambda x: global_array(x, sharding), part),
        shardings,
        host,
    )


def make_normalize_fn(
    cfg: NormalizeConfig,
    gamma: float,
    mesh: Mesh,
    normalizer: Normalizer,
    num_actors: int,
    compiler_options: dict[str, str] | None = None,
) -> Callable:
    """jit(shard_map(normalize_batch)): (normalizer, per-actor trajectories, behaviour obs
    statistics per actor) -> (normalizer, trajectories as the update consumes them, whether
    the normalizer's statistics are all finite)."""

    def body(norm: Normalizer, trajs: tuple[Trajectory, ...], behaviour: tuple[RunningStats, ...]):
        return normalize_batch(norm, trajs, behaviour, cfg, gamma, AXIS)

    specs = normalizer_specs(normalizer)
    trajs_spec = (TRAJECTORY_SPEC,) * num_actors
    behaviour_spec = (P(),) * num_actors if cfg.obs else ()
    sharded = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(specs, trajs_spec, behaviour_spec),
        out_specs=(specs, trajs_spec, P()),
    )
    return jax.jit(sharded, compiler_options=compiler_options)
