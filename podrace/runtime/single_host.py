"""One host, threads: build every component, check it, then run actors, learner, evaluator.

Everything that can fail because of the config (devices, env ids, sizes, run directory)
fails here before any thread starts. Steady-state loops run in threads under
`jax.transfer_guard("disallow")`; jitted functions are compiled (warmed up) first so the
compile time is reported apart from training time.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np

from podrace.actor import Actor, LearnerPlacement, make_policy_fns
from podrace.config import TrainConfig, validate
from podrace.envs import env_spec, make_env, resolve_backend
from podrace.evaluate import EvalResult, Evaluator, make_greedy_policy
from podrace.learner import Learner, make_algorithm, make_mesh, make_update_fn, env_keys, trajectory_shardings
from podrace.metrics.loggers import ConsoleSink, JsonlSink, Sink, TensorBoardSink
from podrace.metrics.registry import Metrics
from podrace.networks import make_network
from podrace.pipeline import Pipeline
from podrace.runtime.devices import resolve_devices
from podrace.runtime.lifetime import Lifetime
from podrace.runtime.rundir import create_run_dir
from podrace.runtime.threads import ThreadGroup
from podrace.runtime.watchdog import Watchdog
from podrace.runtime.distributed import local_copy
from podrace.sync.local import LocalPublisher
from podrace.types import Trajectory

JOIN_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path
    updates: int
    env_steps: int
    compile_s: float
    train_s: float
    learn_s: float
    """Seconds from starting the threads until the last update was published (train_s also
    counts the final evaluation and shutdown)."""
    final_eval: EvalResult | None
    max_policy_lag: float


def _seed_key(seed: int, *path: int) -> jax.Array:
    key = jax.random.PRNGKey(seed)
    for i in path:
        key = jax.random.fold_in(key, i)
    return key


def _env_seed(seed: int, stream: int, actor_id: int) -> int:
    """Distinct, reproducible env seeds per (run seed, stream, actor)."""
    return int(np.random.SeedSequence([seed, stream, actor_id]).generate_state(1)[0] & 0x7FFFFFFF)


def _dummy_trajectory(cfg: TrainConfig, spec, num_envs: int, device: jax.Device) -> Trajectory:
    T, B = cfg.rollout_length, num_envs
    action = np.zeros((T, B) + spec.action_shape, np.int32 if spec.discrete else np.float32)
    obs = np.zeros((T, B) + spec.obs_shape, spec.obs_dtype)
    f = np.zeros((T, B), np.float32)
    b = np.zeros((T, B), bool)
    host = Trajectory(obs, action, f, f, f, b, b, b, obs[0], f[0])
    return jax.device_put(host, device)


def train(cfg: TrainConfig) -> TrainResult:
    """Train with the single-host thread runtime; raises ConfigError before anything starts."""
    return prepare(cfg).run()


def prepare(cfg: TrainConfig) -> "SingleHostRun":
    """Validate, build and compile everything; no thread is started yet."""
    validate(cfg)
    resolve_backend(cfg.env)
    devices = resolve_devices(cfg)
    spec = env_spec(cfg.env)
    run_dir = create_run_dir(cfg)
    (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
    return SingleHostRun(cfg, spec, devices, run_dir)


class SingleHostRun:
    """Every component of one run, wired together; `run()` starts the threads."""

    def __init__(self, cfg: TrainConfig, spec, devices, run_dir: Path):
        self.cfg, self.run_dir = cfg, run_dir
        self.lifetime = lifetime = Lifetime()
        self.metrics = metrics = Metrics()
        # Seeds follow the global actor id; only process 0 of a multi-host run evaluates.
        first_actor = (cfg.distributed.process_id or 0) * cfg.num_actors
        self.evaluates = not cfg.distributed.process_id
        self.watchdog = watchdog = Watchdog(lifetime, cfg.safety.watchdog_s)
        network = make_network(cfg.network, spec)
        apply_fn = network.apply
        mesh = make_mesh(devices.learners)
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        dummy_obs = np.zeros((1,) + spec.obs_shape, spec.obs_dtype)
        params = jax.jit(network.init, out_shardings=replicated)(_seed_key(cfg.seed, 0), dummy_obs)
        algo = make_algorithm(cfg, apply_fn)
        state = jax.jit(algo.init, out_shardings=replicated)(params)
        update_fn = make_update_fn(algo, mesh, cfg.num_actors)
        keys = env_keys(_seed_key(cfg.seed, 1), cfg.num_actors, cfg.env.num_envs, mesh)

        self.pipeline = pipeline = Pipeline(cfg.num_actors, cfg.layout.queue_size, cfg.max_policy_lag, lifetime)
        # Actors get this process's copy of the (possibly multi-process) replicated params.
        self.publisher = publisher = LocalPublisher(transform=local_copy)
        lifetime.on_stop(publisher.close)
        placement = LearnerPlacement(*trajectory_shardings(mesh))
        policy = make_policy_fns(apply_fn)
        greedy = make_greedy_policy(apply_fn)

        compile_start = time.perf_counter()
        _warm_up(cfg, spec, state, keys, update_fn, policy, greedy, placement, devices)
        self.compile_s = time.perf_counter() - compile_start

        self.actors = [
            Actor(
                actor_id=actor_id,
                env=make_env(cfg.env, cfg.env.num_envs, _env_seed(cfg.seed, 0, first_actor + actor_id)),
                device=devices.actors[actor_id // cfg.layout.actors_per_device],
                key=_seed_key(cfg.seed, 2, first_actor + actor_id),
                policy=policy,
                subscriber=publisher.subscribe(
                    device=devices.actors[actor_id // cfg.layout.actors_per_device], name=f"actor-{actor_id}"
                ),
                placement=placement,
                pipeline=pipeline,
                metrics=metrics,
                lifetime=lifetime,
                rollout_length=cfg.rollout_length,
                num_rollouts=cfg.num_updates,
                max_policy_lag=cfg.max_policy_lag,
                heartbeat=watchdog.heartbeat(f"actor-{actor_id}"),
            )
            for actor_id in range(cfg.num_actors)
        ]
        self.evaluator = Evaluator(
            env=make_env(cfg.env, cfg.eval.num_envs, _env_seed(cfg.seed, 1, 0)),
            device=devices.evaluator,
            policy=greedy,
            subscriber=publisher.subscribe(device=devices.evaluator, name="evaluator"),
            episodes=cfg.eval.episodes,
            metrics=metrics,
            lifetime=lifetime,
            heartbeat=watchdog.heartbeat("evaluator"),
        )
        self.learner = Learner(
            state=state,
            keys=keys,
            update_fn=update_fn,
            pipeline=pipeline,
            publisher=publisher,
            metrics=metrics,
            lifetime=lifetime,
            num_updates=cfg.num_updates,
            steps_per_update=cfg.steps_per_update,
            skip_nonfinite=cfg.safety.on_nonfinite == "skip",
            on_update=self._after_update,
        )

    def _after_update(self, version: int) -> None:
        every = self.cfg.eval.every_updates
        if self.evaluates and every and version % every == 0 and version < self.cfg.num_updates:
            self.evaluator.request(version)

    def run(self) -> TrainResult:
        cfg, lifetime, metrics = self.cfg, self.lifetime, self.metrics
        final: list[EvalResult] = []
        learned: list[float] = []

        def learn() -> None:
            self.learner.run()
            learned.append(time.perf_counter() - train_start)
            if self.evaluates:
                final.append(self.evaluator.evaluate_final(self.learner.version))
            lifetime.stop("finished")

        sinks: list[Sink] = [JsonlSink(self.run_dir / "metrics.jsonl")]
        if cfg.log.tensorboard:
            sinks.append(TensorBoardSink(self.run_dir / "tensorboard"))
        if cfg.log.console != "none":
            sinks.append(ConsoleSink(cfg.log.console, cfg.total_steps))

        group = ThreadGroup(lifetime)
        train_start = time.perf_counter()
        try:
            for actor in self.actors:
                group.spawn(f"actor-{actor.actor_id}", actor.run)
            if self.evaluates:
                group.spawn("evaluator", self.evaluator.run)
            group.spawn("learner", learn)
            group.spawn("watchdog", self.watchdog.run, guard_transfers=False)
            _log_until_stopped(self, sinks, train_start)
        finally:  # also on KeyboardInterrupt: stop, join, flush, then let it propagate
            lifetime.stop("shutdown")
            stuck = group.join(JOIN_TIMEOUT_S)
            train_s = time.perf_counter() - train_start
            _write_line(self, sinks, train_start, final=True)
            for sink in sinks:
                sink.close()
            for actor in self.actors:
                actor.env.close()
            self.evaluator.env.close()
            if stuck and lifetime.failure is None:
                lifetime.fail("runtime", TimeoutError(f"threads did not stop within {JOIN_TIMEOUT_S}s: {stuck}"))
        if lifetime.failure is not None:
            raise lifetime.failure
        return TrainResult(
            run_dir=self.run_dir,
            updates=self.learner.version,
            env_steps=int(metrics.total("env_steps")),
            compile_s=self.compile_s,
            train_s=train_s,
            learn_s=learned[0] if learned else train_s,
            final_eval=final[0] if final else None,
            max_policy_lag=float(metrics.last("lag/max_seen", 0.0)),
        )


def _warm_up(cfg, spec, state, keys, update_fn, policy, greedy, placement, devices) -> None:
    """Compile every jitted function of the loops on dummy data (results discarded)."""
    for device in devices.actors:
        params = jax.device_put(local_copy(state.params), device)
        obs = jax.device_put(np.zeros((cfg.env.num_envs,) + spec.obs_shape, spec.obs_dtype), device)
        key = jax.device_put(jax.random.PRNGKey(0), device)
        action, logprob, value, _ = policy.step(params, obs, key)
        policy.value(params, obs)
        steps = (obs,) * cfg.rollout_length
        policy.stack(steps, (action,) * cfg.rollout_length, (logprob,) * cfg.rollout_length, (value,) * cfg.rollout_length)
        traj = placement.place(_dummy_trajectory(cfg, spec, cfg.env.num_envs, device))
    trajs = (traj,) * cfg.num_actors
    jax.block_until_ready(update_fn(state, trajs, keys))
    eval_params = jax.device_put(local_copy(state.params), devices.evaluator)
    eval_obs = jax.device_put(np.zeros((cfg.eval.num_envs,) + spec.obs_shape, spec.obs_dtype), devices.evaluator)
    jax.block_until_ready(greedy(eval_params, eval_obs))


def _write_line(run: SingleHostRun, sinks, start: float, final: bool = False) -> None:
    line = run.metrics.collect()
    line.update({f"sync/{k}": v for k, v in run.publisher.metrics().items()})
    elapsed = time.perf_counter() - start
    line["time_s"] = elapsed
    line["sps"] = line.get("env_steps", 0.0) / max(elapsed, 1e-9)
    if final:
        line["final"] = 1
    for sink in sinks:
        sink.write(line)


def _log_until_stopped(run: SingleHostRun, sinks, start: float) -> None:
    while not run.lifetime.wait(run.cfg.log.interval_s):
        _write_line(run, sinks, start)
