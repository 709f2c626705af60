"""envpool adapter: synchronous stepping (batch_size = num_envs), next-step autoreset.

envpool already autoresets on the step after a done one (reward 0, action ignored), which
is podrace's convention, so this adapter only translates: actions in, EnvStep out.
For Atari, envpool reports the unclipped reward in info["reward"] and game over in
info["terminated"]; with episodic life a lost life sets `terminated` but the game goes on.
"""

from __future__ import annotations

import threading
import types
from typing import Any

import numpy as np

from podrace.config import ConfigError, EnvConfig
from podrace.envs.base import env_seeds
from podrace.envs.episode_stats import EpisodeStats
from podrace.envs.resolve import is_envpool_atari
from podrace.envs.spaces import ActionPreparer, ObsIndices, OneHotObs, spec_from_spaces
from podrace.types import EnvSpec, EnvStep, JaxEnvStep

MAX_ATARI_IMAGE_SIZE = 1024
MAX_ATARI_FRAME_STACK = 256
"""Past the screen's own 210x160, a larger frame only repeats pixels; far past it, building
the env's observation space alone would need gigabytes (image_size 100000: 37 GiB)."""


def make_spec(env_id: str, **kwargs: Any) -> Any:
    """`envpool.make_spec`, where envpool first loads the env's native module: one that
    cannot load (Procgen without the system's Qt 5) is a ConfigError naming the env, the
    library the loader did not find and envpool's own hint, not an ImportError traceback."""
    import envpool

    try:
        return envpool.make_spec(env_id, **kwargs)
    except ImportError as error:
        cause = error.__cause__ if isinstance(error.__cause__, ImportError) else None
        reason = " ".join(str(error).split()) or type(error).__name__
        if cause is not None and str(cause).strip():
            reason = f"{' '.join(str(cause).split())} ({reason})"
        raise ConfigError(
            f"env {env_id!r} cannot be made, a library it needs is missing: {reason}"
        ) from None


def make_kwargs(cfg: EnvConfig) -> dict[str, Any]:
    """envpool.make keyword arguments for the EnvConfig settings that apply to `cfg.id`.

    Every key is checked against the env's envpool config, so a setting can never be
    silently dropped (envpool would raise a bare TypeError).
    """
    kwargs: dict[str, Any] = {}
    if cfg.max_episode_steps is not None:
        if cfg.max_episode_steps <= 0:
            raise ConfigError(
                f"env.max_episode_steps must be positive, got {cfg.max_episode_steps}"
            )
        kwargs["max_episode_steps"] = cfg.max_episode_steps
    if is_envpool_atari(cfg.id):
        if min(cfg.frame_skip, cfg.frame_stack, cfg.image_size, cfg.noop_max) < 1:
            raise ConfigError(
                "env.frame_skip, env.frame_stack, env.image_size and env.noop_max must be >= 1 "
                "for Atari (noop_max=1 means no no-ops)"
            )
        if cfg.image_size > MAX_ATARI_IMAGE_SIZE:
            raise ConfigError(
                f"env.image_size must be at most {MAX_ATARI_IMAGE_SIZE} for Atari (the 210x160 "
                f"screen is resized to image_size x image_size), got {cfg.image_size}"
            )
        if cfg.frame_stack > MAX_ATARI_FRAME_STACK:
            raise ConfigError(
                f"env.frame_stack must be at most {MAX_ATARI_FRAME_STACK} for Atari, "
                f"got {cfg.frame_stack}"
            )
        kwargs.update(
            frame_skip=cfg.frame_skip,
            stack_num=cfg.frame_stack,
            img_height=cfg.image_size,
            img_width=cfg.image_size,
            repeat_action_probability=cfg.sticky_action_prob,
            full_action_space=cfg.full_action_space,
            episodic_life=cfg.episodic_life,
            reward_clip=cfg.reward_clip,
            noop_max=cfg.noop_max,
        )
    accepted = set(make_spec(cfg.id)._config_keys)
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise ConfigError(f"envpool env {cfg.id!r} does not accept {', '.join(unknown)}")
    return kwargs


def envpool_spec(cfg: EnvConfig) -> EnvSpec:
    """EnvSpec from envpool's spec object, without building an env."""
    spec = make_spec(cfg.id, **make_kwargs(cfg))
    spec = spec_from_spaces(cfg.id, spec.gymnasium_observation_space, spec.gymnasium_action_space)
    select = ObsIndices.of(cfg.obs_indices, spec, cfg.id)
    return spec if select is None else select.spec(spec)


def translate(
    terminated: Any, truncated: Any, reward: Any, info: dict, atari: bool
) -> tuple[Any, Any, Any, Any]:
    """envpool's step in podrace's terms: (terminated, truncated, raw reward, episode done),
    on NumPy (host stepping) or inside a jitted rollout alike.

    For Atari the reported episode is the game (info["terminated"]) and its raw reward is
    info["reward"]; envpool marks a step truncated whenever the time limit is hit, even on
    the step the game ended, and a finished game must not be bootstrapped."""
    if not atari:
        return terminated, truncated, reward, terminated | truncated
    game_over = info["terminated"].astype(bool)
    truncated = truncated & ~game_over
    return terminated | game_over, truncated, info["reward"], game_over | truncated


class EnvpoolEnv:
    """BatchedEnv over one synchronous envpool instance."""

    def __init__(
        self, cfg: EnvConfig, num_envs: int, seed: int, seeds: list[int] | None = None
    ) -> None:
        """`seeds`: each env's own seed (default: derived from `seed`, `env_seeds`)."""
        import envpool

        self._env = envpool.make(
            cfg.id,
            env_type="gymnasium",
            num_envs=num_envs,
            batch_size=num_envs,
            seed=env_seeds(seed, num_envs) if seeds is None else list(seeds),
            **({} if cfg.num_threads is None else {"num_threads": cfg.num_threads}),
            **make_kwargs(cfg),
        )
        self.num_envs = num_envs
        self.spec = spec_from_spaces(cfg.id, self._env.observation_space, self._env.action_space)
        self._atari = is_envpool_atari(cfg.id)
        self._one_hot = OneHotObs.of(self._env.observation_space)
        self._select = ObsIndices.of(cfg.obs_indices, self.spec, cfg.id)
        if self._select is not None:
            self.spec = self._select.spec(self.spec)
        self._prepare = ActionPreparer(
            self.spec, num_envs, self._env.spec.action_array_spec["action"].dtype
        )
        # 32-bit counts, as a fused rollout (`xla_step`) keeps them: the same episode returns
        # whether an actor steps this env one call at a time or in compiled calls.
        self._stats = EpisodeStats(num_envs, np.float32, np.int32)
        self._started = False
        self._closed = False

    def reset(self) -> np.ndarray:
        obs, _ = self._env.reset()
        self._stats.reset()
        self._started = True
        return self._as_spec(obs)

    def _as_spec(self, obs: np.ndarray) -> np.ndarray:
        """envpool's observations as the spec says: one-hot, then the kept entries."""
        if self._one_hot is not None:
            obs = self._one_hot(obs)
        return obs if self._select is None else self._select(obs)

    def step(self, actions: np.ndarray) -> EnvStep:
        if not self._started:
            raise RuntimeError("call reset() before step()")
        # envpool returns freshly allocated arrays each step (tests/envs check that
        # earlier results are never overwritten), so nothing is copied here.
        obs, reward, terminated, truncated, info = self._env.step(self._prepare(actions))
        terminated, truncated, raw_reward, episode_done = translate(
            terminated, truncated, reward, info, self._atari
        )
        episode_return, episode_length = self._stats.update(
            raw_reward, terminated, truncated, episode_done
        )
        return EnvStep(
            obs=self._as_spec(obs),
            reward=reward.astype(np.float32, copy=False),
            terminated=terminated,
            truncated=truncated,
            episode_done=episode_done,
            episode_return=episode_return,
            episode_length=episode_length,
        )

    def xla_step(self) -> XlaStep | None:
        """This env's step as a JAX function (envpool's XLA interface), so rollouts compile
        into XLA calls (`podrace.fused_rollout`); None where JAX (32-bit) cannot carry the
        env's dtypes (MuJoCo's float64 observations and actions)."""
        dtypes = {
            np.dtype(self._env.spec.action_array_spec["action"].dtype),
            np.dtype(self.spec.obs_dtype),
        }
        if dtypes & {np.dtype(np.float64), np.dtype(np.int64)}:
            return None
        handle, _, _, step = effect_free_xla(self._env)
        return XlaStep(
            handle, step, self.spec, self.num_envs, self._atari, self._one_hot, self._select
        )

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._env.close()


_XLA_TEMPLATE_LOCK = threading.Lock()


def effect_free_xla(env: Any) -> tuple[Any, Any, Any, Any]:
    """envpool's `env.xla()` (handle, recv, send, step), its FFI calls declared free of side
    effects.

    envpool declares its send and recv custom calls side-effecting, which gives every
    program using them an effect, and JAX runs a compiled program with effects through its
    Python dispatch path: about 180 us more per 8-step CartPole rollout call on this
    project's 2-core machine (on the actor's critical path, holding the GIL). The effect is
    not needed here: the handle is threaded through every call (envpool aliases it input
    to output), so data dependencies alone order the calls, and every fused program returns
    its last handle, so no call is dead code. Where envpool's template no longer works as
    expected, its own calls are used as they are.
    """
    from envpool.python import xla_template
    from jax import ffi

    def ffi_call(*args: Any, **kwargs: Any) -> Any:
        return ffi.ffi_call(*args, **{**kwargs, "has_side_effect": False})

    with _XLA_TEMPLATE_LOCK:
        if getattr(xla_template, "ffi", None) is not ffi:
            return env.xla()
        xla_template.ffi = types.SimpleNamespace(
            register_ffi_target=ffi.register_ffi_target, ffi_call=ffi_call
        )
        try:
            return env.xla()
        finally:
            xla_template.ffi = ffi


class XlaStep:
    """One step of every env inside a jitted function: `(handle, actions) -> (handle,
    JaxEnvStep)`, with the same translation as `EnvpoolEnv.step` (clipped continuous
    actions, Atari's raw reward and game over). The handle threads the calls in order."""

    def __init__(
        self,
        handle: np.ndarray,
        step: Any,
        spec: EnvSpec,
        num_envs: int,
        atari: bool,
        one_hot: OneHotObs | None,
        select: ObsIndices | None = None,
    ) -> None:
        self.handle, self._step, self._spec, self._atari, self._one_hot = (
            handle,
            step,
            spec,
            atari,
            one_hot,
        )
        self._select = select
        self._env_ids = np.arange(num_envs, dtype=np.int32)

    def __call__(self, handle: Any, actions: Any) -> tuple[Any, JaxEnvStep]:
        import jax.numpy as jnp

        if self._spec.discrete:
            actions = actions.astype(jnp.int32)
        else:
            actions = jnp.clip(actions, self._spec.action_low, self._spec.action_high).astype(
                jnp.float32
            )
        handle, (obs, reward, terminated, truncated, info) = self._step(
            handle, actions, jnp.asarray(self._env_ids)
        )
        terminated, truncated, raw_reward, episode_done = translate(
            terminated, truncated, reward, info, self._atari
        )
        if self._one_hot is not None:
            obs = self._one_hot.jax(obs)
        if self._select is not None:
            obs = self._select.jax(obs)
        return handle, JaxEnvStep(
            obs, reward.astype(jnp.float32), terminated, truncated, raw_reward, episode_done
        )
