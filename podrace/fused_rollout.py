"""An actor's rollout compiled: policy and env steps together in XLA calls, on a CPU device.

On XLA:CPU a small policy's cost is per-call overhead (dispatch, a host->device copy of the
observations, a device->host copy of the actions, Python bookkeeping), paid once per env
step by the step-by-step loop. envpool exposes its step as an XLA custom call, so for its
envs up to CHUNK_STEPS steps run inside one `lax.scan`, and the last call also assembles the
trajectory (a rollout of up to CHUNK_STEPS steps is one call): nothing crosses between host
and device but the episode statistics at its end, packed into one array.

It computes exactly what the step-by-step loop computes (same key stream, same valid
mask, same episode counting, a recurrent policy's core state carried in the scan and reset
by the same network; `tests/test_fused_rollout.py` compares the two). Each chunk
is one watched env call for the watchdog, and a stop is seen between chunks. Used where it
can be: an envpool env whose dtypes JAX carries, acting on a CPU device, or envs written in
JAX (`podrace.envs.device_env`) on any device, whose state then rides in the carry in place
of envpool's handle (`fused_rollout_for`). The evaluator's greedy episodes run the same way
(`FusedEpisodes`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import config as jax_config

from podrace.envs.episode_stats import EpisodeCounts, count_step, zero_counts
from podrace.types import Trajectory


class EnvCarry(NamedTuple):
    """What one rollout hands the next, kept on the actor's device."""

    handle: Any  # envpool's handle (orders the custom calls), or a JAX env's state
    obs: Any  # [B, ...] observation the next step acts on
    prev_done: Any  # [B] the last step ended (terminated or truncated): the next is an autoreset
    counts: EpisodeCounts
    core: Any = ()  # a recurrent policy's core state the next step starts from; () if none


class FusedOutput(NamedTuple):
    trajectory: Trajectory
    episodes: Any
    """int32 [3, T, B]: a reported episode ended at this step, its return (float32 bits),
    its length; one array, so the host fetches a rollout's episode statistics in one copy
    (`unpack_episodes`)."""


def pack_episodes(done: Any, returns: Any, lengths: Any) -> Any:
    """[steps, envs] episode ends, float32 returns and int32 lengths as one int32 array."""
    bits = jax.lax.bitcast_convert_type(returns.astype(jnp.float32), jnp.int32)
    return jnp.stack([done.astype(jnp.int32), bits, lengths.astype(jnp.int32)])


def unpack_episodes(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The host side of `pack_episodes`: (done, returns, lengths), each [steps, envs]."""
    packed = np.asarray(packed)
    return packed[0].astype(bool), packed[1].view(np.float32), packed[2]


def first_carry(handle: Any, obs: np.ndarray, device: jax.Device, core: Any = ()) -> EnvCarry:
    """The carry after `env.reset()`: the envs' first observations, counts at zero, and a
    recurrent policy's initial core state `core`."""
    num_envs = obs.shape[0]
    counts = zero_counts(num_envs, np.float32, np.int32)
    return jax.device_put(EnvCarry(handle, obs, np.zeros(num_envs, bool), counts, core), device)


def is_recurrent_policy(policy: Any) -> bool:
    """Whether an actor's PolicyFns or an evaluator's greedy policy is recurrent (it has an
    `initial_state` for its core)."""
    return getattr(policy, "initial_state", None) is not None


CHUNK_STEPS = 32
"""Env steps per XLA call. A stop and the watchdog are seen between calls: a rollout of
hundreds of Atari steps on a CPU must not keep a stopping run waiting for its end."""


def chunk_lengths(rollout_length: int) -> list[int]:
    """The rollout as calls of at most CHUNK_STEPS steps (at most two distinct lengths,
    each compiled once)."""
    full, rest = divmod(rollout_length, CHUNK_STEPS)
    return [CHUNK_STEPS] * full + ([rest] if rest else [])


class FusedRollout:
    """T steps of `policy` on `env` (its `xla_step()`) as compiled calls of at most
    CHUNK_STEPS steps; the last call also assembles the trajectory, so a rollout of up to
    CHUNK_STEPS steps is one call.

    Keys cross the calls as raw key data (`jax.random.key_data`): JAX's C++ dispatch takes
    arrays of standard dtypes only, and a typed key sends every call through its Python
    path (about 25 us more per call here)."""

    def __init__(
        self, env: Any, policy: Any, xla_step: Any, rollout_length: int, device: jax.Device
    ):
        self.env, self.policy, self.device = env, policy, device
        self.lengths = chunk_lengths(rollout_length)
        self._xla_step = xla_step
        self._chunks: dict[int, Callable] = {
            n: jax.jit(_chunk_fn(policy, xla_step, n)) for n in sorted(set(self.lengths[:-1]))
        }
        self._last: Callable = jax.jit(_last_fn(policy, xla_step, self.lengths[-1]))
        self.carry: EnvCarry | None = None

    def begin(self, obs: np.ndarray, core: Any = ()) -> None:
        """After `env.reset()`: the envs' first observations, counts at zero, and a recurrent
        policy's initial core state (on the device)."""
        self.carry = first_carry(self._xla_step.handle, obs, self.device, core)

    def compile(self, params: Any, key: Any, obs_like: np.ndarray, core: Any = ()) -> None:
        """Compile every call for these shapes without stepping the envs (before threads start)."""
        carry = self.carry
        self.begin(obs_like, core)
        rows = []
        for n, fn in self._chunks.items():
            self._chunks[n] = compile_for(self._xla_step, fn.lower(params, key, self.carry))
        for n in self.lengths[:-1]:  # the rows' shapes, from the compiled chunks' output types
            _, _, out = self._chunks[n].out_info
            rows.append(
                jax.tree.map(
                    lambda info: jax.ShapeDtypeStruct(
                        info.shape, info.dtype, sharding=info.sharding
                    ),
                    out,
                )
            )
        self._last = compile_for(
            self._xla_step, self._last.lower(params, key, self.carry, tuple(rows), self.carry.core)
        )
        self.carry = carry

    def chunk(self, steps: int, params: Any, key: Any) -> tuple[Any, Any]:
        """The next `steps` steps of a rollout but its last: (new key, rows); the carry moves on.

        Returns once the steps ran (not when they were dispatched): the watchdog then times
        the env itself, and no env is closed under a call still running or queued."""
        key, self.carry, rows = jax.block_until_ready(self._chunks[steps](params, key, self.carry))
        return key, rows

    def last(
        self, params: Any, key: Any, rows: list, first_core: Any = ()
    ) -> tuple[Any, FusedOutput]:
        """The rollout's last steps, and the rollout from the earlier chunks' `rows` and
        these (with the bootstrap value of the obs after them, stamped with a recurrent
        policy's core state `first_core` from before its first step): (new key, output).
        Returns once it ran, as `chunk` does."""
        key, self.carry, out = jax.block_until_ready(
            self._last(params, key, self.carry, tuple(rows), first_core)
        )
        return key, out


def _scan_steps(policy: Any, env_step: Any, steps: int, params, key, carry: EnvCarry):
    """`steps` steps of policy (PolicyFns) and env from `carry`: ((raw key, carry), rows)."""
    recurrent = is_recurrent_policy(policy)

    def body(state, _):
        key, carry = state
        valid = ~carry.prev_done
        core = carry.core
        if recurrent:
            action, logprob, value, core, key = policy.step(params, carry.obs, valid, core, key)
        else:
            action, logprob, value, key = policy.step(params, carry.obs, key)
        after, step, episode_return, episode_length = _env_step(env_step, carry, action, core)
        row = (
            carry.obs,
            action,
            logprob,
            value,
            step.reward,
            step.terminated,
            step.truncated,
            valid,
            step.episode_done,
            episode_return,
            episode_length,
        )
        return (key, after), row

    return jax.lax.scan(body, (key, carry), None, length=steps)


def _env_step(env_step: Any, carry: EnvCarry, action, core) -> tuple:
    """One env step from `carry` with `action`: (the carry after it, with the episode counts
    advanced and the policy's core state `core`; the step; the return and length of an
    episode ending there)."""
    handle, step = env_step(carry.handle, action)
    counts, episode_return, episode_length = count_step(
        carry.counts,
        step.raw_reward,
        step.terminated,
        step.truncated,
        step.episode_done,
        xp=jnp,
    )
    done = step.terminated | step.truncated
    return EnvCarry(handle, step.obs, done, counts, core), step, episode_return, episode_length


def _chunk_fn(policy: Any, env_step: Any, steps: int) -> Callable:
    def chunk(params, key, carry: EnvCarry):
        (key, carry), rows = _scan_steps(policy, env_step, steps, params, key, carry)
        return key, carry, rows

    return chunk


def _last_fn(policy: Any, env_step: Any, steps: int) -> Callable:
    recurrent = is_recurrent_policy(policy)

    def last(params, key, carry: EnvCarry, earlier: tuple, first_core):
        (key, carry), rows = _scan_steps(policy, env_step, steps, params, key, carry)
        chunks = (*earlier, rows)
        rows = (
            jax.tree.map(lambda *parts: jnp.concatenate(parts), *chunks)
            if len(chunks) > 1
            else rows
        )
        # a row: the Trajectory's per-step fields (obs ... valid), then the episode ends
        *per_step, done, returns, lengths = rows
        if recurrent:
            last_value = policy.value(params, carry.obs, carry.core)
        else:
            last_value = policy.value(params, carry.obs)
        trajectory = Trajectory(*per_step, carry.obs, last_value, first_core)
        return key, carry, FusedOutput(trajectory, pack_episodes(done, returns, lengths))

    return last


class FusedEpisodes:
    """Greedy evaluation steps compiled, CHUNK_STEPS per XLA call: only whether an episode
    ended at each step, its return and its length come back to the host."""

    def __init__(self, env: Any, greedy: Any, xla_step: Any, device: jax.Device):
        self.env, self.device, self._greedy = env, device, greedy
        self._xla_step = xla_step
        self._chunk: Callable = jax.jit(_greedy_chunk_fn(greedy, xla_step, CHUNK_STEPS))
        self._carry: EnvCarry | None = None

    def begin(self, obs: np.ndarray) -> None:
        """After `env.reset()`: the envs' first observations, counts at zero (a recurrent
        policy's core at its initial state)."""
        core = ()
        if is_recurrent_policy(self._greedy):
            core = self._greedy.initial_state(obs.shape[0])
        self._carry = first_carry(self._xla_step.handle, obs, self.device, core)

    def compile(self, params: Any, obs_like: np.ndarray) -> None:
        """Compile the call for these shapes without stepping the envs."""
        self.begin(obs_like)
        self._chunk = compile_for(self._xla_step, self._chunk.lower(params, self._carry))
        self._carry = None

    def chunk(self, params: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The next CHUNK_STEPS steps: [steps, envs] (episode ended, its return, its length)."""
        self._carry, packed = self._chunk(params, self._carry)
        return unpack_episodes(jax.device_get(packed))


def _greedy_chunk_fn(greedy: Any, env_step: Any, steps: int) -> Callable:
    recurrent = is_recurrent_policy(greedy)

    def chunk(params, carry: EnvCarry):
        def body(carry, _):
            core = carry.core
            if recurrent:
                action, core = greedy.step(params, carry.obs, ~carry.prev_done, core)
            else:
                action = greedy(params, carry.obs)
            after, step, episode_return, episode_length = _env_step(env_step, carry, action, core)
            return after, (step.episode_done, episode_return, episode_length)

        carry, rows = jax.lax.scan(body, carry, None, length=steps)
        return carry, pack_episodes(*rows)

    return chunk


def compile_uncached(lowered: Any) -> Any:
    """Compile without writing JAX's persistent cache (`podrace train` turns it on).

    envpool's XLA step names its env object (its id and address) in the program, so a
    program with env steps differs in every run: no later run can load its entry, and each
    run would only grow the cache. The threshold is set for this thread only (a JAX config
    context, not yet public API)."""
    with jax_config.persistent_cache_min_compile_time_secs(math.inf):
        return lowered.compile()


def compile_for(xla_step: Any, lowered: Any) -> Any:
    """Compile a program with `xla_step`'s env steps: through JAX's persistent cache where
    the step says its programs are the same in every run (`cacheable`: a JAX env's), else
    without it (envpool's, `compile_uncached`)."""
    return lowered.compile() if getattr(xla_step, "cacheable", False) else compile_uncached(lowered)


def _env_xla_step(env: Any, device: jax.Device | None) -> tuple[Any, jax.Device] | None:
    """(the env's XLA step, the device) where steps can be compiled, else None: the env has
    no XLA step (not envpool or a JAX env, or float64 dtypes), or the device is an
    accelerator and the step runs on the host only (envpool's custom call; a JAX env, whose
    class says `steps_on_any_device`, steps wherever its program runs).

    Only an env whose own class defines `xla_step` is fused: a wrapper that forwards other
    attributes to an inner env (`__getattr__`) changes what `step` does, and fusing the
    inner env would silently bypass it."""
    device = device or jax.devices()[0]
    if getattr(type(env), "xla_step", None) is None:
        return None
    if device.platform != "cpu" and not getattr(type(env), "steps_on_any_device", False):
        return None
    step = env.xla_step()
    return None if step is None else (step, device)


def fused_rollout_for(env: Any, policy: Any, rollout_length: int) -> FusedRollout | None:
    """A FusedRollout for this actor, or None where the step-by-step loop must run."""
    found = _env_xla_step(env, policy.device)
    return None if found is None else FusedRollout(env, policy, found[0], rollout_length, found[1])


def fused_episodes_for(env: Any, greedy: Any, device: jax.Device | None) -> FusedEpisodes | None:
    """FusedEpisodes for an evaluator, or None where it must step its env one call at a time."""
    found = _env_xla_step(env, device)
    return None if found is None else FusedEpisodes(env, greedy, *found)
