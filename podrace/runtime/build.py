"""Factories every topology calls: the learner side, one actor, the evaluator, warm-ups.

The cluster (one process, a Ray driver, a jax.distributed group) and the fleet (actor
threads, served actors with env workers, Ray workers) decide where each piece runs and how
the pieces are connected (`podrace.runtime.topology`); these functions decide what each
piece is, from the config alone, so that an actor built in a Ray worker is the actor a
thread would run. Seeds and keys derive from (run seed, stream, id) only.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence

import jax
import numpy as np

from podrace.actor import Actor, ActorSettings, PolicyFns, RolloutSink
from podrace.algos.base import TrainState
from podrace.algos.normalizer import Normalizer, init_normalizer
from podrace.compile_once import compile_once
from podrace.config import TrainConfig
from podrace.control import Control, Lifetime
from podrace.envs import BatchedEnv, EnvSource
from podrace.evaluate import Evaluator
from podrace.learner import Learner, LearnerSettings
from podrace.learner_mesh import (
    LearnerPlacement,
    env_keys,
    learner_compiler_options,
    make_algorithm,
    make_mesh,
    make_normalize_fn,
    make_update_fn,
    place_normalizer,
    trajectory_shardings,
)
from podrace.metrics.registry import Metrics
from podrace.networks import initial_core_state
from podrace.pipeline import Pipeline
from podrace.sync.base import Publisher, Subscriber
from podrace.types import EnvSpec, Trajectory


def seed_key(seed: int, *path: int) -> jax.Array:
    key = jax.random.PRNGKey(seed)
    for i in path:
        key = jax.random.fold_in(key, i)
    return key


def env_seed(seed: int, stream: int, actor_id: int, *more: int) -> int:
    """Distinct, reproducible env seeds per (run seed, stream, actor[, more, e.g. a resume
    point])."""
    return int(
        np.random.SeedSequence([seed, stream, actor_id, *more]).generate_state(1)[0] & 0x7FFFFFFF
    )


def env_threads(cfg: TrainConfig) -> int | None:
    """envpool worker threads for one actor's envs when `env.num_threads` is left open: in
    the thread runtime, this host's cores after one for the learner, shared by its actors
    (every member's actors of a population) (at least 1); Ray workers (on other nodes, with
    their own CPUs) keep envpool's default, which was slower per rollout on 2 cores
    (docs/benchmarks.md, `cartpole_ppo.py`: envpool worker threads)."""
    if cfg.env.num_threads is not None or cfg.runtime == "ray":
        return cfg.env.num_threads
    # A population's members share this host's cores: every member's actors count.
    actors = cfg.num_actors * cfg.pbt.population
    return max(1, (len(os.sched_getaffinity(0)) - 1) // actors)


def actor_key(cfg: TrainConfig, actor_id: int) -> jax.Array:
    """The policy-sampling key actor `actor_id` (of this process) of a fresh run starts with."""
    return seed_key(cfg.seed, 2, (cfg.distributed.process_id or 0) * cfg.num_actors + actor_id)


def build_learner(
    cfg: TrainConfig,
    spec: EnvSpec,
    network,
    devices: Sequence[jax.Device],
    pipeline: Pipeline,
    publisher: Publisher,
    metrics: Metrics,
    lifetime: Lifetime,
    restore: Callable[..., tuple[TrainState, jax.Array, Normalizer | None]] | None = None,
    wrap_update: Callable[[Callable], Callable] | None = None,
) -> tuple[Learner, LearnerPlacement]:
    """The learner on its mesh (initial params, with the initial observation statistics when
    normalizing, published as the publisher's first version) and the placement that puts a
    rollout's arrays onto that mesh.

    `restore(state, keys, normalizer)` (resuming a run) returns the state, keys and
    normalizer to start from, placed like the fresh ones it is given (its template); the
    reward-scaling tracker starts fresh, as the resumed run's envs do."""
    mesh = make_mesh(devices)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    dummy_obs, key = np.zeros((1,) + spec.obs_shape, spec.obs_dtype), seed_key(cfg.seed, 0)
    init = jax.jit(network.init, out_shardings=replicated).lower(key, dummy_obs)
    params = compile_once(init, devices[0].platform)(key, dummy_obs)
    algo = make_algorithm(cfg, network.apply)
    state = jax.jit(algo.init, out_shardings=replicated)(params)
    keys = env_keys(seed_key(cfg.seed, 1), cfg.num_actors, cfg.env.num_envs, mesh)
    settings = LearnerSettings(
        num_updates=cfg.num_updates,
        steps_per_update=cfg.steps_per_update,
        skip_nonfinite=cfg.safety.on_nonfinite == "skip",
        max_skipped=math.floor(cfg.safety.max_skipped_fraction * cfg.num_updates),
        max_policy_lag=cfg.max_policy_lag,
    )
    normalizer = init_normalizer(
        cfg.normalize, spec.obs_shape, jax.process_count() * cfg.num_actors * cfg.env.num_envs
    )
    options = learner_compiler_options(cfg.network, mesh)
    normalize_fn = None
    if normalizer is not None:
        normalizer = place_normalizer(normalizer, mesh)
        normalize_fn = make_normalize_fn(
            cfg.normalize, cfg.gamma, mesh, normalizer, cfg.num_actors, options
        )
    if restore is not None:
        fresh = normalizer
        state, keys, normalizer = restore(state, keys, normalizer)
        if fresh is not None and fresh.tracker is not None:
            # A resumed run restarts its envs: each env's discounted return (reward scaling)
            # starts again from 0 with its new episode, not from the old one's partial sum.
            normalizer = normalizer._replace(tracker=fresh.tracker)
    learner = Learner(
        settings,
        state=state,
        keys=keys,
        update_fn=(wrap_update or (lambda fn: fn))(
            make_update_fn(algo, mesh, cfg.num_actors, options)
        ),
        pipeline=pipeline,
        publisher=publisher,
        metrics=metrics,
        lifetime=lifetime,
        normalizer=normalizer,
        normalize_fn=normalize_fn,
    )
    return learner, LearnerPlacement(*trajectory_shardings(mesh))


def actor_settings(
    cfg: TrainConfig, actor_id: int, first_seq: int = 0, key: jax.Array | None = None
) -> ActorSettings:
    """Actor `actor_id`'s settings: its rollouts from `first_seq` on, its key (default
    `actor_key`)."""
    return ActorSettings(
        actor_id=actor_id,
        rollout_length=cfg.rollout_length,
        num_rollouts=cfg.num_updates - first_seq,
        max_policy_lag=cfg.max_policy_lag,
        key=actor_key(cfg, actor_id) if key is None else key,
        first_seq=first_seq,
    )


def actor_env_seed(cfg: TrainConfig, actor_id: int, first_seq: int = 0) -> int:
    """The seed of actor `actor_id`'s envs (see `build_actor`)."""
    global_id = (cfg.distributed.process_id or 0) * cfg.num_actors + actor_id
    later = (first_seq,) if first_seq else ()
    return env_seed(cfg.seed, 0, global_id, *later)


def build_actor(
    cfg: TrainConfig,
    actor_id: int,
    policy: PolicyFns,
    params: Subscriber,
    out: RolloutSink,
    control: Control,
    first_seq: int = 0,
    envs: EnvSource | None = None,
    key: jax.Array | None = None,
    wrap_env: Callable[[str, BatchedEnv], BatchedEnv] | None = None,
) -> Actor:
    """Actor `actor_id` with its own envs (from `envs`, default `cfg.env`'s id) and key;
    `policy.device` is where it acts.

    Key and env seeds follow the global actor id (process id x actors per process + id):
    the processes of a multi-host run never share seeds. An actor that starts later in the
    run (`first_seq` > 0: a resumed run) gets env seeds with `first_seq` folded in, so its
    envs do not replay the episodes the run's start already played; `key` (default
    `actor_key`) is its key. `wrap_env(owner, env)` may wrap the envs (fault injection).
    """
    settings = actor_settings(cfg, actor_id, first_seq, key)
    envs = envs or EnvSource(cfg.env)
    env = envs.make(cfg.env.num_envs, actor_env_seed(cfg, actor_id, first_seq), env_threads(cfg))
    if wrap_env is not None:
        env = wrap_env(f"actor-{actor_id}", env)
    return Actor(settings, env, policy, params, out, control)


def build_evaluator(
    cfg: TrainConfig,
    greedy: Callable,
    device: jax.Device,
    params: Subscriber,
    metrics: Metrics,
    control: Control,
    envs: EnvSource | None = None,
    wrap_env: Callable[[str, BatchedEnv], BatchedEnv] | None = None,
) -> Evaluator:
    envs = envs or EnvSource(cfg.env)
    # Each env counts its own share of `episodes` (`EpisodeTally`): more envs than episodes
    # would only play uncounted episodes (and building 2**31 of them would not finish).
    num_envs = min(cfg.eval.num_envs, cfg.eval.episodes)
    env = envs.make(num_envs, env_seed(cfg.seed, 1, 0), env_threads(cfg))
    if wrap_env is not None:
        env = wrap_env("evaluator", env)
    evaluator = Evaluator(env, device, greedy, params, cfg.eval.episodes, metrics, control)
    evaluator.time_limit = cfg.env.max_episode_steps
    return evaluator


def dummy_trajectory(cfg: TrainConfig, spec: EnvSpec, device: jax.Device) -> Trajectory:
    """Zeros shaped like one actor's rollout, on `device` (for compiling)."""
    T, B = cfg.rollout_length, cfg.env.num_envs
    action = np.zeros((T, B) + spec.action_shape, np.int32 if spec.discrete else np.float32)
    obs = np.zeros((T, B) + spec.obs_shape, spec.obs_dtype)
    f = np.zeros((T, B), np.float32)
    b = np.zeros((T, B), bool)
    core = initial_core_state(cfg.network, B)
    return jax.device_put(Trajectory(obs, action, f, f, f, b, b, b, obs[0], f[0], core), device)


def warm_up_learner(learner: Learner, trajs: Sequence[Trajectory]) -> None:
    """Compile the batch preparation (normalization) and the update on placed dummy
    trajectories (state, normalizer and keys are not changed)."""
    _, trajs, _ = learner.prepare(tuple(trajs), [learner.version] * len(trajs))
    # The step itself: a wrapper around it (fault injection) sees only the run's updates.
    update = getattr(learner.update_fn, "__wrapped__", learner.update_fn)
    jax.block_until_ready(update(learner.state, trajs, learner.keys))
