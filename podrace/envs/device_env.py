"""A batch of JAX envs (gymnax's interface) with podrace's next-step autoreset, on a device.

`DeviceStep` is the batched step as a JAX function of an explicit state, `(EnvHandle,
actions) -> (EnvHandle, JaxEnvStep)`: the envs' states, the key their randomness comes from
and which envs reset at their next step all live in the handle. An actor's compiled
rollout (`podrace.fused_rollout`) carries the handle through its `lax.scan`, so a whole
rollout of env and policy steps is one program on the actor's device, any platform.

`DeviceEnv` is the same envs as a host `BatchedEnv` (each call jitted; arrays cross with
explicit transfers): what the evaluator, a wrapper, or a test stepping one call at a time
uses. Both run the same function on the same keys, so they step the same episodes.

Keys: one key per batch of envs, from the env seed (itself derived from the run seed and
the global actor id, and the resume point of a resumed run); every step splits it into the
next key, one key per env for the step and one per env for resets. Reproducible for a
given seed, and independent of how the steps are grouped into calls.

Autoreset is next-step: the step after a terminated or truncated one resets that env with
its reset key, ignores the action, returns reward 0 and the first observation. A step
computes the resets of the envs that reset there only (`DeviceStep._reset_where`).
Truncation is the env's `is_truncated(state, params)` where it has one, else gymnax's time
limit (`state.time >= params.max_steps_in_episode`) where state and params have those
fields; otherwise every `done` is a termination (Craftax, whose state counts `timestep`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from podrace.compile_once import compile_once
from podrace.envs.episode_stats import EpisodeStats
from podrace.envs.jax_envs import JaxEnv, kept_observations, raw_jax_env_spec
from podrace.envs.spaces import ObsIndices
from podrace.types import EnvStep, JaxEnvStep

RESET_BLOCK_DIVISOR = 64
"""A step resets its ended envs in blocks of `num_envs // RESET_BLOCK_DIVISOR` envs (at
least one): one env at a time for the batches a CPU steps, wider blocks where thousands of
envs step at once on an accelerator."""


class EnvHandle(NamedTuple):
    """What a batch of JAX envs carries from one step to the next."""

    state: Any  # the envs' states, batched [B, ...]
    key: Any  # uint32[2]: raw (threefry) key data the next step's randomness derives from
    reset_next: Any  # bool [B]: the env's last step ended an episode, so its next one resets


class DeviceStep:
    """`num_envs` envs of `env`, stepped as JAX functions (`reset(key)`, `__call__`).

    Read by `podrace.fused_rollout`: `handle` (the state the next rollout starts from) and
    `cacheable` (its programs are the same in every run, so they may go to JAX's persistent
    compile cache)."""

    cacheable = True

    def __init__(
        self, env: JaxEnv, num_envs: int, spec: Any, select: ObsIndices | None = None
    ) -> None:
        """`spec` as podrace sees the env; `select` keeps entries of the env's observations."""
        self.env, self.num_envs, self.spec, self._select = env, num_envs, spec, select
        self.current: EnvHandle | None = None
        """The state after the last `DeviceEnv.reset` or `step` (None before a reset)."""
        self._truncation = _truncation_fn(env)
        self._reset_block = max(1, num_envs // RESET_BLOCK_DIVISOR)

    @property
    def handle(self) -> EnvHandle:
        """Where a compiled rollout starts: the current state, or before any reset zeros
        shaped like it (what programs are compiled for)."""
        if self.current is not None:
            return self.current
        shapes = jax.eval_shape(self.reset, jax.ShapeDtypeStruct((2,), np.uint32))[0]
        return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)

    def reset(self, key: Any) -> tuple[EnvHandle, Any]:
        """Every env reset: (handle, obs [B, ...]); `key` raw key data."""
        key, reset_key = jax.random.split(key)
        obs, state = self._reset_all(reset_key)
        return EnvHandle(state, key, jnp.zeros(self.num_envs, bool)), self._observed(obs)

    def _observed(self, obs: Any) -> Any:
        return obs if self._select is None else self._select.jax(obs)

    def _reset_all(self, key: Any) -> tuple[Any, Any]:
        return self._reset_envs(jax.random.split(key, self.num_envs))

    def _reset_envs(self, keys: Any) -> tuple[Any, Any]:
        """(obs, state) of one env reset per key of `keys` [n, 2]."""
        return jax.vmap(lambda k: self.env.env.reset_env(k, self.env.params))(keys)

    def __call__(self, handle: EnvHandle, actions: Any) -> tuple[EnvHandle, JaxEnvStep]:
        env, params, spec = self.env.env, self.env.params, self.spec
        if spec.discrete:
            actions = actions.astype(jnp.int32)
        else:
            actions = jnp.clip(actions, spec.action_low, spec.action_high).astype(jnp.float32)
        key, step_key, reset_key = jax.random.split(handle.key, 3)
        step_keys = jax.random.split(step_key, self.num_envs)
        obs, state, reward, done, _ = jax.vmap(lambda k, s, a: env.step_env(k, s, a, params))(
            step_keys, handle.state, actions
        )
        truncated = self._truncation(state) & ~handle.reset_next
        terminated = done.astype(bool) & ~truncated & ~handle.reset_next
        reward = jnp.where(handle.reset_next, 0.0, reward).astype(jnp.float32)

        obs, state = self._reset_where(handle.reset_next, reset_key, obs, state)
        ended = terminated | truncated
        return EnvHandle(state, key, ended), JaxEnvStep(
            self._observed(obs), reward, terminated, truncated, reward, ended
        )

    def _reset_where(self, need: Any, key: Any, obs: Any, state: Any) -> tuple[Any, Any]:
        """`obs` and `state` [B, ...] with the envs `need` marks reset, env `i` with key `i`
        of `key` split per env (as `_reset_all` resets it).

        Only those envs' resets are computed: they are gathered, RESET_BLOCK_DIVISOR-th of
        the batch (at least one env) at a time, reset and scattered back, in a loop that
        runs as many times as the step's resets need (none in most steps). An env's reset
        can cost many of its steps (Craftax generates a world), and resetting the whole
        batch whenever one env ends would add that cost to almost every step."""
        keys = jax.random.split(key, self.num_envs)
        block = self._reset_block
        ordered = jnp.argsort(~need, stable=True)  # the envs to reset first
        blocks = (need.sum() + block - 1) // block

        def reset_block(i, carry):
            obs, state = carry
            # the last block may start earlier, resetting envs again with the same keys
            start = jnp.minimum(i * block, self.num_envs - block)
            envs = jax.lax.dynamic_slice_in_dim(ordered, start, block)
            fresh_obs, fresh_state = self._reset_envs(keys[envs])
            chosen = need[envs]

            def put(stepped, fresh):
                where = chosen.reshape((-1,) + (1,) * (stepped.ndim - 1))
                return stepped.at[envs].set(jnp.where(where, fresh, stepped[envs]))

            return put(obs, fresh_obs), jax.tree.map(put, state, fresh_state)

        return jax.lax.fori_loop(0, blocks, reset_block, (obs, state))


def _truncation_fn(env: JaxEnv) -> Any:
    """state [B] -> bool [B]: which envs' last step reached their time limit."""
    own = getattr(env.env, "is_truncated", None)
    if callable(own):
        return jax.vmap(lambda state: jnp.asarray(own(state, env.params), bool))
    if hasattr(env.params, "max_steps_in_episode"):
        limit = env.params.max_steps_in_episode

        def reached(state):
            time = getattr(state, "time", None)
            return jnp.zeros((), bool) if time is None else time >= limit

        return jax.vmap(reached)
    return jax.vmap(lambda state: jnp.zeros((), bool))


class DeviceEnv:
    """`num_envs` JAX envs as a host BatchedEnv; `xla_step()` gives their step as a JAX
    function for compiled rollouts, on any device. Deterministic given `seed`."""

    steps_on_any_device = True

    def __init__(self, env: JaxEnv, num_envs: int, seed: int) -> None:
        raw = raw_jax_env_spec(env)
        select = kept_observations(env, raw)
        self.spec = raw if select is None else select.spec(raw)
        self.num_envs = num_envs
        self._step_fn = DeviceStep(env, num_envs, self.spec, select)
        self._key = jax.random.key_data(jax.random.key(seed))
        # Compiled here (before any thread starts): a run's actors and evaluator reset their
        # envs from their threads, where a compile would be counted as training time.
        # A reset runs once per evaluation or actor start: compiled for compile speed.
        reset = jax.jit(_next_reset(self._step_fn)).lower(self._key)
        self._reset = compile_once(reset, next(iter(self._key.devices())).platform)
        self._step = jax.jit(self._step_fn)
        # 32-bit counts, as a compiled rollout keeps them: the same episode returns either way.
        self._stats = EpisodeStats(num_envs, np.float32, np.int32)

    def reset(self) -> np.ndarray:
        """Every env reset with a key split from this env's own (each reset starts new
        episodes); the compiled step's handle starts there too."""
        self._key, self._step_fn.current, obs = self._reset(self._key)
        self._stats.reset()
        return np.asarray(jax.device_get(obs))

    def step(self, actions: np.ndarray) -> EnvStep:
        if self._step_fn.current is None:
            raise RuntimeError("call reset() before step()")
        self._step_fn.current, step = self._step(self._step_fn.current, jax.device_put(actions))
        obs, reward, terminated, truncated, raw_reward, done = jax.device_get(step)
        episode_return, episode_length = self._stats.update(raw_reward, terminated, truncated, done)
        return EnvStep(
            np.asarray(obs),
            np.asarray(reward),
            np.asarray(terminated),
            np.asarray(truncated),
            np.asarray(done),
            episode_return,
            episode_length,
        )

    def xla_step(self) -> DeviceStep:
        return self._step_fn

    def close(self) -> None:
        self._step_fn.current = None


def _next_reset(step: DeviceStep) -> Any:
    """own key -> (next own key, handle, obs): a reset with a key split from the env's own."""

    def reset(key):
        key, reset_key = jax.random.split(key)
        return (key, *step.reset(reset_key))

    return reset
