"""Gymnasium adapter: `gymnasium.make_vec` (sync) in next-step autoreset mode.

The Atari settings of EnvConfig do not apply here. A registered env whose dependency is
missing (a MuJoCo id without `mujoco`, a Box2D id without `box2d`) is a config error,
found when the spec is read during validation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import gymnasium

from podrace.config import ConfigError, EnvConfig
from podrace.envs.spaces import ObsIndices, spec_from_spaces
from podrace.envs.vector_adapter import VectorEnvAdapter
from podrace.types import EnvSpec

T = TypeVar("T")


def make_kwargs(cfg: EnvConfig) -> dict[str, Any]:
    """gymnasium.make keyword arguments: only the time-limit override applies."""
    if cfg.max_episode_steps is None:
        return {}
    if cfg.max_episode_steps <= 0:
        raise ConfigError(f"env.max_episode_steps must be positive, got {cfg.max_episode_steps}")
    return {"max_episode_steps": cfg.max_episode_steps}


def dependency_checked(env_id: str, make: Callable[[], T]) -> T:
    """`make()`, with a missing package of the env reported as one line."""
    try:
        return make()
    except (ImportError, gymnasium.error.DependencyNotInstalled) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(
            f"env {env_id!r} cannot be made, a package it needs is missing: {reason}"
        ) from None


def gymnasium_spec(cfg: EnvConfig) -> EnvSpec:
    """EnvSpec read from one throwaway env instance."""
    env = dependency_checked(cfg.id, lambda: gymnasium.make(cfg.id, **make_kwargs(cfg)))
    try:
        spec = spec_from_spaces(cfg.id, env.observation_space, env.action_space)
        select = ObsIndices.of(cfg.obs_indices, spec, cfg.id)
        return spec if select is None else select.spec(spec)
    finally:
        from podrace.envs.closing import close_envs

        close_envs([(f"env {cfg.id!r} (spec probe)", env)])  # user code: a warning, bounded


def make_gymnasium_env(
    cfg: EnvConfig, num_envs: int, seed: int, seeds: list[int] | None = None
) -> VectorEnvAdapter:
    """BatchedEnv over `num_envs` copies of `cfg.id` in one `SyncVectorEnv` (`seeds`: each
    env's own seed, default derived from `seed`)."""
    env = dependency_checked(
        cfg.id,
        lambda: gymnasium.make_vec(
            cfg.id,
            num_envs=num_envs,
            vectorization_mode="sync",
            # The adapter copies each obs out of the vector env's buffer (copy=False here).
            vector_kwargs={
                "autoreset_mode": gymnasium.vector.AutoresetMode.NEXT_STEP,
                "copy": False,
            },
            **make_kwargs(cfg),
        ),
    )
    try:
        return VectorEnvAdapter(env, seed, cfg.id, cfg.obs_indices, seeds)
    except BaseException:
        env.close()
        raise
