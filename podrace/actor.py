"""The actor loop: the only place `env.step` is called during training.

An actor thread owns its envs, its random key and a weight-sync subscriber. Before rollout
`seq` it makes sure its params are at least version `seq - max_policy_lag` (waiting if the
learner is behind), then steps T times: observations go host->device and actions
device->host with explicit transfers only; everything else of the rollout stays on the
actor device until it is split along the env axis and placed, piece by piece, on the
learner devices as one sharded Trajectory.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from podrace.envs import BatchedEnv
from podrace.metrics.registry import Metrics
from podrace.pipeline import Pipeline
from podrace.runtime.lifetime import Lifetime, Stopped
from podrace.runtime.watchdog import Heartbeat
from podrace.sync.base import Subscriber
from podrace.types import Rollout, Trajectory


@dataclass(frozen=True)
class PolicyFns:
    """Jitted functions an actor runs on its device (shared by all actors)."""

    step: Callable  # (params, obs, key) -> (action, logprob, value, key)
    value: Callable  # (params, obs) -> value
    stack: Callable  # (tuple of per-step arrays...) -> stacked [T, ...] arrays


def make_policy_fns(apply_fn: Callable) -> PolicyFns:
    def step(params, obs, key):
        key, sample_key = jax.random.split(key)
        dist, value = apply_fn(params, obs)
        action = dist.sample(sample_key)
        return action, dist.log_prob(action), value, key

    def value(params, obs):
        return apply_fn(params, obs)[1]

    def stack(obs, actions, logprobs, values):
        return jnp.stack(obs), jnp.stack(actions), jnp.stack(logprobs), jnp.stack(values)

    return PolicyFns(step=jax.jit(step), value=jax.jit(value), stack=jax.jit(stack))


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
            shape = local[:axis] + (local[axis] * self.num_shards,) + local[axis + 1 :]
            sharding = self.time_sharding if time_major else self.env_sharding
            return jax.make_array_from_single_device_arrays(shape, sharding, shards)

        return Trajectory(
            *(assemble(f, True) for f in Trajectory._fields[:8]),
            last_obs=assemble("last_obs", False),
            last_value=assemble("last_value", False),
        )


class EnvError(RuntimeError):
    """env.step raised; the message says at which step of which rollout."""


class Actor:
    """One actor thread's state and loop."""

    def __init__(
        self,
        actor_id: int,
        env: BatchedEnv,
        device: jax.Device,
        key: jax.Array,
        policy: PolicyFns,
        subscriber: Subscriber,
        placement: LearnerPlacement,
        pipeline: Pipeline,
        metrics: Metrics,
        lifetime: Lifetime,
        rollout_length: int,
        num_rollouts: int,
        max_policy_lag: int,
        heartbeat: Heartbeat,
    ):
        self.actor_id = actor_id
        self.heartbeat = heartbeat
        self.env_steps = 0
        self.env = env
        self.device = device
        self.key = jax.device_put(key, device)
        self.policy = policy
        self.subscriber = subscriber
        self.placement = placement
        self.pipeline = pipeline
        self.metrics = metrics
        self.lifetime = lifetime
        self.rollout_length = rollout_length
        self.num_rollouts = num_rollouts
        self.max_policy_lag = max_policy_lag
        self.snapshot = None

    def _refresh_params(self, seq: int) -> None:
        """Newest params, and at least version seq - max_policy_lag (wait if needed)."""
        needed = seq - self.max_policy_lag
        if self.snapshot is None or self.snapshot.version < needed:
            start = time.perf_counter()
            self.snapshot = self.subscriber.get(min_version=max(needed, 0))
            self.metrics.add("actor/params_wait", time.perf_counter() - start)
        else:
            newer = self.subscriber.poll()
            if newer is not None:
                self.snapshot = newer

    def run(self) -> None:
        obs = self.env.reset()
        prev_done = np.zeros(self.env.num_envs, dtype=bool)
        for seq in range(self.num_rollouts):
            self.lifetime.check()
            self._refresh_params(seq)
            rollout, obs, prev_done = self._rollout(seq, obs, prev_done)
            rollout.timings["queue_put_wait"] = self.pipeline.put(rollout)
            self.metrics.add_many({f"actor/{k}": v for k, v in rollout.timings.items()})

    def _env_step(self, actions: np.ndarray, seq: int):
        self.env_steps += 1
        self.heartbeat.enter("env.step", self.env_steps)
        try:
            return self.env.step(actions)
        except Stopped:
            raise
        except Exception as error:
            raise EnvError(
                f"env.step raised at step {self.env_steps} (rollout {seq}): {type(error).__name__}: {error}"
            ) from error
        finally:
            self.heartbeat.exit()

    def _rollout(self, seq: int, obs: np.ndarray, prev_done: np.ndarray):
        T, B = self.rollout_length, self.env.num_envs
        params, version = self.snapshot.params, self.snapshot.version
        rewards = np.zeros((T, B), np.float32)
        terminated = np.zeros((T, B), bool)
        truncated = np.zeros((T, B), bool)
        valid = np.zeros((T, B), bool)
        obs_d, actions_d, logprobs_d, values_d = [], [], [], []
        returns, lengths = [], []
        t_inference = t_d2h = t_env = 0.0
        start = time.perf_counter()
        for t in range(T):
            t0 = time.perf_counter()
            obs_dev = jax.device_put(obs, self.device)
            action, logprob, value, self.key = self.policy.step(params, obs_dev, self.key)
            action.block_until_ready()
            t1 = time.perf_counter()
            action_host = jax.device_get(action)
            t2 = time.perf_counter()
            step = self._env_step(action_host, seq)
            t3 = time.perf_counter()
            t_inference += t1 - t0
            t_d2h += t2 - t1
            t_env += t3 - t2
            obs_d.append(obs_dev)
            actions_d.append(action)
            logprobs_d.append(logprob)
            values_d.append(value)
            rewards[t] = step.reward
            terminated[t] = step.terminated
            truncated[t] = step.truncated
            valid[t] = ~prev_done
            prev_done = step.terminated | step.truncated
            if step.episode_done.any():
                returns.append(step.episode_return[step.episode_done])
                lengths.append(step.episode_length[step.episode_done])
            obs = step.obs
        last_obs = jax.device_put(obs, self.device)
        last_value = self.policy.value(params, last_obs)
        stacked = self.policy.stack(tuple(obs_d), tuple(actions_d), tuple(logprobs_d), tuple(values_d))
        host = jax.device_put((rewards, terminated, truncated, valid), self.device)
        traj = Trajectory(*stacked, *host, last_obs=last_obs, last_value=last_value)
        t4 = time.perf_counter()
        traj = self.placement.place(traj)
        jax.block_until_ready(traj)
        t5 = time.perf_counter()
        rollout = Rollout(
            actor_id=self.actor_id,
            seq=seq,
            policy_version=version,
            trajectory=traj,
            episode_returns=np.concatenate(returns) if returns else np.zeros(0),
            episode_lengths=np.concatenate(lengths) if lengths else np.zeros(0, np.int64),
            timings={
                "inference": t_inference,
                "device_to_host": t_d2h,
                "env_step": t_env,
                "to_learner": t5 - t4,
                "rollout": t5 - start,
            },
        )
        return rollout, obs, prev_done
