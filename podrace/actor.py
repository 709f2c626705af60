"""The actor loop: the only place `env.step` is called during training.

An actor owns its envs, its random key and a weight-sync subscriber. Before rollout `seq`
it makes sure its params are at least version `seq - max_policy_lag` (waiting if the
learner is behind), then steps T times: observations go host->device and actions
device->host with explicit transfers only.

Per step the loop does only what cannot be moved out of it: one `device_put` of the
observations, one jitted policy call (sampling with a cheap PRNG, see `SAMPLING_PRNG`), one
`device_get` of the actions, one env step, and row writes into host arrays allocated once
per rollout (rewards, flags), moved to the device in one transfer at its end. On XLA:CPU a
small policy's cost is per-call overhead, not arithmetic (`benchmarks/cartpole_ppo.py`).
Where the env allows it (envpool, dtypes JAX carries, a CPU actor device; or envs written
in JAX, on any actor device) the rollout instead runs as XLA calls of up to 32 steps each
(`podrace.fused_rollout`), with the same results.
The finished rollout (arrays on the actor's device) goes to a `RolloutSink`; where it goes
from there (a queue in this process, the learner's mesh, another machine) is the sink's
business, so the same loop runs in a thread or in a remote worker.

A recurrent policy's core state lives with the actor, on its device: it is carried from
step to step and from one rollout to the next (reset where an episode ended, by the network
itself: `podrace.networks.recurrent`), and each rollout is stamped with the state its first
step started from (`Trajectory.core_state`). An actor starts from the initial (zero) state
when its envs are reset, i.e. when it starts. A resumed run's actors therefore restart
their cores from the initial state: their envs are fresh too (new seeds, new episodes), and
the checkpoint holds no core state.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np

from podrace.algos.base import RecurrentApply, is_recurrent
from podrace.control import Control, Stopped
from podrace.envs import BatchedEnv
from podrace.fused_rollout import fused_rollout_for, unpack_episodes
from podrace.sync.base import Subscriber
from podrace.sync.placement import place
from podrace.types import PyTree, Rollout, Trajectory


@dataclass(frozen=True)
class PolicyFns:
    """Jitted functions an actor runs, and the device it runs them on.

    A recurrent policy's `step` and `value` also take the core's state:
    step(params, obs, valid, state, key data) -> (action, logprob, value, next state, key
    data), where `valid` [B] is the step's mask (False on an autoreset step), and
    value(params, obs, state) -> value."""

    # (params, obs, key data) -> (action, logprob, value, key data); see `sampling_key`
    step: Callable
    value: Callable  # (params, obs) -> value
    stack: Callable  # (tuple of per-step arrays...) -> stacked [T, ...] arrays
    device: jax.Device | None = None
    initial_state: Callable[[int], PyTree] | None = None
    """Recurrent policies: number of envs -> the core's initial state (host arrays); None
    for a feed-forward policy."""

    @property
    def recurrent(self) -> bool:
        return self.initial_state is not None

    def on(self, device: jax.Device) -> PolicyFns:
        """The same compiled functions, run on `device`."""
        return dataclasses.replace(self, device=device)


SAMPLING_PRNG = "unsafe_rbg"
"""PRNG implementation of the actor's sampling key.

Threefry (JAX's default) lowers to a rolled loop of small kernels on XLA:CPU: splitting the
key and drawing the Gumbel noise of one step took about as long as the policy network
itself. `unsafe_rbg` draws with one RngBitGenerator op. It is just as deterministic (a run
with the same seed samples the same actions); what it gives up is the guarantee that split
streams are statistically independent, which action sampling does not need. Learner and
evaluator keys stay threefry."""


def sampling_key(key: jax.Array) -> jax.Array:
    """The actor's sampling key derived from a raw (threefry) key, e.g. `ActorSettings.key`:
    the raw data (uint32[4]) of a SAMPLING_PRNG key, which `PolicyFns.step` takes and returns.

    Raw keys cross jitted calls because JAX's C++ dispatch takes arrays of standard dtypes
    only: a typed key sent every policy call through its Python path (about 25 us more per
    call on the 2-core machine). Raw uint32[2] keys stay the currency of settings and
    checkpoints; the conversion is a pure function of them, so a resumed or restarted actor
    derives the same key again.
    """
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):  # a typed threefry key: its raw data
        key = jax.random.key_data(key)
    return jax.random.bits(jax.random.wrap_key_data(key, impl="threefry2x32"), (4,), jnp.uint32)


def make_policy_fns(apply_fn: Callable) -> PolicyFns:
    """An actor's functions for a network's `apply` (a `RecurrentApply` gives recurrent ones)."""
    if is_recurrent(apply_fn):
        return _recurrent_policy_fns(apply_fn)

    def step(params, obs, key_data):
        key, sample_key = jax.random.split(jax.random.wrap_key_data(key_data, impl=SAMPLING_PRNG))
        dist, value = apply_fn(params, obs)
        action = dist.sample(sample_key)
        return action, dist.log_prob(action), value, jax.random.key_data(key)

    def value(params, obs):
        return apply_fn(params, obs)[1]

    def stack(obs, actions, logprobs, values):
        return jnp.stack(obs), jnp.stack(actions), jnp.stack(logprobs), jnp.stack(values)

    return PolicyFns(step=jax.jit(step), value=jax.jit(value), stack=jax.jit(stack))


def _recurrent_policy_fns(apply_fn: RecurrentApply) -> PolicyFns:
    """A recurrent network's step: one step of its unroll (T = 1) from the carried state."""

    def first(tree):
        return jax.tree.map(lambda x: x[0], tree)

    def step(params, obs, valid, state, key_data):
        key, sample_key = jax.random.split(jax.random.wrap_key_data(key_data, impl=SAMPLING_PRNG))
        dist, value, states = apply_fn(params, obs[None], valid[None], state)
        dist = first(dist)
        action = dist.sample(sample_key)
        return action, dist.log_prob(action), value[0], first(states), jax.random.key_data(key)

    def value(params, obs, state):
        # The step's output does not depend on its mask, only the state after it does.
        return apply_fn(params, obs[None], jnp.ones((1, obs.shape[0]), bool), state)[1][0]

    def stack(obs, actions, logprobs, values):
        return jnp.stack(obs), jnp.stack(actions), jnp.stack(logprobs), jnp.stack(values)

    return PolicyFns(
        step=jax.jit(step),
        value=jax.jit(value),
        stack=jax.jit(stack),
        initial_state=apply_fn.initial_state,
    )


@dataclass(frozen=True)
class ActorSettings:
    actor_id: int
    rollout_length: int
    num_rollouts: int
    max_policy_lag: int
    key: jax.Array
    """This actor's policy sampling key (derived from the run seed and the actor id)."""
    first_seq: int = 0
    """Sequence number of the first rollout (after a checkpoint: where the last run stopped)."""


class RolloutSink(Protocol):
    """Where an actor's rollouts go."""

    def put(self, rollout: Rollout) -> float:
        """Hand over `rollout` (may block for back-pressure); returns the seconds waited."""
        ...


class EnvError(RuntimeError):
    """env.step or env.reset raised; the message says at which step of which rollout."""


class Actor:
    """One actor's state and loop."""

    def __init__(
        self,
        settings: ActorSettings,
        env: BatchedEnv,
        policy: PolicyFns,
        params: Subscriber,
        out: RolloutSink,
        control: Control,
    ):
        self.settings = settings
        self.env = env
        self.policy = policy
        self.params = params
        self.out = out
        self.control = control
        self.key = jax.device_put(sampling_key(settings.key), policy.device)
        self.snapshot = None
        self.env_steps = 0
        self.core: PyTree = ()
        """A recurrent policy's core state for the next step (on the actor's device)."""
        self.fused = fused_rollout_for(env, policy, settings.rollout_length)
        """The rollout as XLA calls where the env allows it (`podrace.fused_rollout`)."""
        self.take_episode_info: Callable[[], dict[str, np.ndarray]] | None = getattr(
            env, "take_episode_info", None
        )
        """What the env reported in `info` as episodes ended (envs that keep it: a
        Gymnasium vector env's adapter, or a BatchedEnv with `take_episode_info`)."""

    @property
    def actor_id(self) -> int:
        return self.settings.actor_id

    def warm_up(self, params) -> None:
        """Compile what this actor runs, on its device, without stepping its envs (results
        discarded); `params` as published (`Learner.acting_params()`)."""
        T, B, device = self.settings.rollout_length, self.env.num_envs, self.policy.device
        params = place(params, device)
        obs = np.zeros((B,) + self.env.spec.obs_shape, self.env.spec.obs_dtype)
        if self.fused is not None:
            self.fused.compile(params, self.key, obs, self._initial_core())
            return
        obs = jax.device_put(obs, device)
        if self.policy.recurrent:
            core, valid = self._initial_core(), jax.device_put(np.ones(B, bool), device)
            action, logprob, value, _, _ = self.policy.step(params, obs, valid, core, self.key)
            self.policy.value(params, obs, core)
        else:
            action, logprob, value, _ = self.policy.step(params, obs, self.key)
            self.policy.value(params, obs)
        jax.block_until_ready(
            self.policy.stack((obs,) * T, (action,) * T, (logprob,) * T, (value,) * T)
        )

    def _initial_core(self) -> PyTree:
        """A recurrent policy's initial core state on the actor's device; () if feed-forward."""
        if not self.policy.recurrent:
            return ()
        return jax.device_put(self.policy.initial_state(self.env.num_envs), self.policy.device)

    def run(self) -> None:
        s = self.settings
        obs = self._env_call("env.reset", self.env.reset)
        prev_done = np.zeros(self.env.num_envs, dtype=bool)
        self.core = self._initial_core()  # fresh envs, fresh memory
        if self.fused is not None and (self.fused.env, self.fused.policy) != (
            self.env,
            self.policy,
        ):
            self.fused = None  # env or policy swapped since (a wrapper): step by step through it
        if self.fused is not None:
            self.fused.begin(obs, self.core)
        for seq in range(s.first_seq, s.first_seq + s.num_rollouts):
            self.control.check()
            self._refresh_params(seq)
            if self.fused is not None:
                rollout = self._fused_rollout(seq)
            else:
                rollout, obs, prev_done = self._rollout(seq, obs, prev_done)
            rollout.timings["queue_put_wait"] = self.out.put(rollout)
            self.control.record({f"actor/{k}": v for k, v in rollout.timings.items()})

    def _refresh_params(self, seq: int) -> None:
        """Newest params, and at least version seq - max_policy_lag (wait if needed)."""
        needed = seq - self.settings.max_policy_lag
        if self.snapshot is None or self.snapshot.version < needed:
            start = time.perf_counter()
            self.snapshot = self.params.get(min_version=max(needed, 0))
            self.control.record({"actor/params_wait": time.perf_counter() - start})
        else:
            newer = self.params.poll()
            if newer is not None:
                self.snapshot = newer

    def _env_call(self, what: str, fn: Callable, *args, seq: int | None = None, steps: int = 1):
        """One watched env call (of `steps` env steps); a stop is seen before every call,
        errors say where."""
        try:
            return self.control.call(what, self.env_steps, fn, *args, steps=steps)
        except Stopped:
            raise
        except Exception as error:
            where = f"step {self.env_steps}" + (f" (rollout {seq})" if seq is not None else "")
            raise EnvError(f"{what} raised at {where}: {type(error).__name__}: {error}") from error

    def _fused_rollout(self, seq: int) -> Rollout:
        start = time.perf_counter()
        params, key, rows = self.snapshot.params, self.key, []
        first_core = self.fused.carry.core  # the state the rollout's first step starts from
        *leading, last = self.fused.lengths
        # `steps` env steps in one call: the watchdog allows each its timeout, as it does one
        # call at a time in the step-by-step loop; a stop is seen between calls.
        for steps in leading:
            key, chunk = self._env_call(
                "env.rollout", self.fused.chunk, steps, params, key, seq=seq, steps=steps
            )
            self.env_steps += steps
            rows.append(chunk)
        key, out = self._env_call(
            "env.rollout", self.fused.last, params, key, rows, first_core, seq=seq, steps=last
        )
        self.env_steps += last
        self.key, self.core = key, self.fused.carry.core
        done, returns, lengths = unpack_episodes(jax.device_get(out.episodes))
        return Rollout(
            actor_id=self.settings.actor_id,
            seq=seq,
            policy_version=self.snapshot.version,
            trajectory=out.trajectory,
            episode_returns=np.asarray(returns[done], np.float64),
            episode_lengths=np.asarray(lengths[done], np.int64),
            timings={"rollout": time.perf_counter() - start},
        )

    def _rollout(self, seq: int, obs: np.ndarray, prev_done: np.ndarray):
        T, B, device = self.settings.rollout_length, self.env.num_envs, self.policy.device
        params, version = self.snapshot.params, self.snapshot.version
        policy_step, env_step, call = self.policy.step, self.env.step, self._env_call
        # Fresh per rollout (every row is written below): a device copy may still be in
        # flight, or the rollout still queued, when the next rollout starts.
        rewards = np.empty((T, B), np.float32)
        terminated, truncated, valid = (
            np.empty((T, B), bool),
            np.empty((T, B), bool),
            np.empty((T, B), bool),
        )
        obs_d, actions_d, logprobs_d, values_d = [None] * T, [None] * T, [None] * T, [None] * T
        returns, lengths = [], []
        key = self.key
        recurrent, first_core = self.policy.recurrent, self.core
        core = first_core
        t_inference = t_d2h = t_env = 0.0
        start = time.perf_counter()
        for t in range(T):
            np.logical_not(prev_done, out=valid[t])
            t0 = time.perf_counter()
            if recurrent:
                obs_dev, valid_dev = jax.device_put((obs, valid[t]), device)
                obs_d[t] = obs_dev
                action, logprobs_d[t], values_d[t], core, key = policy_step(
                    params, obs_dev, valid_dev, core, key
                )
            else:
                obs_dev = obs_d[t] = jax.device_put(obs, device)
                action, logprobs_d[t], values_d[t], key = policy_step(params, obs_dev, key)
            actions_d[t] = action
            action.block_until_ready()
            t1 = time.perf_counter()
            action_host = jax.device_get(action)
            t2 = time.perf_counter()
            self.env_steps += 1
            step = call("env.step", env_step, action_host, seq=seq)
            t3 = time.perf_counter()
            t_inference += t1 - t0
            t_d2h += t2 - t1
            t_env += t3 - t2
            rewards[t] = step.reward
            terminated[t] = step.terminated
            truncated[t] = step.truncated
            prev_done = step.terminated | step.truncated
            if step.episode_done.any():
                returns.append(step.episode_return[step.episode_done])
                lengths.append(step.episode_length[step.episode_done])
            obs = step.obs
        self.key, self.core = key, core
        last_obs, host = jax.device_put((obs, (rewards, terminated, truncated, valid)), device)
        if recurrent:
            last_value = self.policy.value(params, last_obs, core)
        else:
            last_value = self.policy.value(params, last_obs)
        stacked = self.policy.stack(
            tuple(obs_d), tuple(actions_d), tuple(logprobs_d), tuple(values_d)
        )
        traj = Trajectory(
            *stacked, *host, last_obs=last_obs, last_value=last_value, core_state=first_core
        )
        rollout = Rollout(
            actor_id=self.settings.actor_id,
            seq=seq,
            policy_version=version,
            trajectory=traj,
            episode_returns=np.concatenate(returns) if returns else np.zeros(0),
            episode_lengths=np.concatenate(lengths) if lengths else np.zeros(0, np.int64),
            episode_info=self.take_episode_info() if self.take_episode_info else None,
            timings={
                "inference": t_inference,
                "device_to_host": t_d2h,
                "env_step": t_env,
                "rollout": time.perf_counter() - start,
            },
        )
        return rollout, obs, prev_done
