"""An actor's whole rollout as one XLA call: policy and env steps together, on a CPU device.

On XLA:CPU a small policy's cost is per-call overhead (dispatch, a host->device copy of the
observations, a device->host copy of the actions, Python bookkeeping), paid once per env
step by the step-by-step loop. envpool exposes its step as an XLA custom call, so for its
envs the T steps of a rollout run inside one `lax.scan`: one call per rollout, nothing
crosses between host and device but the episode statistics at its end.

It computes exactly what the step-by-step loop computes (same key stream, same valid
mask, same episode counting; `tests/test_fused_rollout.py` compares the two), and the
rollout is one watched env call for the watchdog. Used where it can be: an envpool env
whose dtypes JAX carries, acting on a CPU device (`fused_rollout_for`).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from podrace.envs.episode_stats import EpisodeCounts, count_step, zero_counts
from podrace.types import Trajectory


class EnvCarry(NamedTuple):
    """What one rollout hands the next, kept on the actor's device."""

    handle: Any  # envpool's handle (orders the custom calls)
    obs: Any  # [B, ...] observation the next step acts on
    prev_done: Any  # [B] the last step ended (terminated or truncated): the next is an autoreset
    counts: EpisodeCounts


class FusedOutput(NamedTuple):
    trajectory: Trajectory
    key: Any
    carry: EnvCarry
    episode_done: Any  # [T, B] a reported episode ended at this step
    episode_return: Any  # [T, B]
    episode_length: Any  # [T, B]


class FusedRollout:
    """T steps of `policy` on `env` (its `xla_step()`) as one compiled function."""

    def __init__(self, env: Any, policy: Any, xla_step: Any, rollout_length: int, device: jax.Device):
        self.env, self.policy, self.device = env, policy, device
        self._handle = xla_step.handle
        self._fn = jax.jit(_rollout_fn(policy.step, policy.value, xla_step, rollout_length))
        self._compiled: Callable | None = None
        self.carry: EnvCarry | None = None

    def begin(self, obs: np.ndarray) -> None:
        """After `env.reset()`: the envs' first observations, counts at zero."""
        num_envs = obs.shape[0]
        self.carry = jax.device_put(
            EnvCarry(self._handle, obs, np.zeros(num_envs, bool), zero_counts(num_envs, np.float32, np.int32)), self.device
        )

    def compile(self, params: Any, key: Any, obs_like: np.ndarray) -> None:
        """Compile for these shapes without stepping the envs (before threads start)."""
        carry = self.carry
        if carry is None:
            self.begin(obs_like)
        self._compiled = self._fn.lower(params, key, self.carry).compile()
        self.carry = carry

    def __call__(self, params: Any, key: Any) -> FusedOutput:
        """One rollout from the current carry; the carry moves on."""
        fn = self._compiled or self._fn
        out = fn(params, key, self.carry)
        self.carry = out.carry
        return out


def _rollout_fn(policy_step: Callable, policy_value: Callable, env_step: Any, T: int) -> Callable:
    def rollout(params, key, carry: EnvCarry) -> FusedOutput:
        def body(state, _):
            key, carry = state
            action, logprob, value, key = policy_step(params, carry.obs, key)
            handle, step = env_step(carry.handle, action)
            counts, episode_return, episode_length = count_step(
                carry.counts, step.raw_reward, step.terminated, step.truncated, step.episode_done, xp=jnp
            )
            row = (carry.obs, action, logprob, value, step.reward, step.terminated, step.truncated,
                   ~carry.prev_done, step.episode_done, episode_return, episode_length)
            done = step.terminated | step.truncated
            return (key, EnvCarry(handle, step.obs, done, counts)), row

        (key, carry), rows = jax.lax.scan(body, (key, carry), None, length=T)
        obs, actions, logprobs, values, rewards, terminated, truncated, valid, done, returns, lengths = rows
        last_value = policy_value(params, carry.obs)
        trajectory = Trajectory(obs, actions, logprobs, values, rewards, terminated, truncated, valid,
                                carry.obs, last_value)
        return FusedOutput(trajectory, key, carry, done, returns, lengths)

    return rollout


def fused_rollout_for(env: Any, policy: Any, rollout_length: int) -> FusedRollout | None:
    """A FusedRollout for this actor, or None where the step-by-step loop must run: the env
    has no XLA step (not envpool, or float64 dtypes), or the actor acts on an accelerator
    (envpool's custom call runs on the host).

    Only an env whose own class defines `xla_step` is fused: a wrapper that forwards other
    attributes to an inner env (`__getattr__`) changes what `step` does, and fusing the
    inner env would silently bypass it."""
    device = policy.device or jax.devices()[0]
    if device.platform != "cpu" or getattr(type(env), "xla_step", None) is None:
        return None
    step = env.xla_step()
    return None if step is None else FusedRollout(env, policy, step, rollout_length, device)
