"""Build a BatchedEnv (or read an EnvSpec) for an EnvConfig on the backend it resolves to."""

from __future__ import annotations

from podrace.config import ConfigError, EnvConfig
from podrace.envs.base import BatchedEnv
from podrace.envs.resolve import resolve_backend
from podrace.types import EnvSpec


def make_env(cfg: EnvConfig, num_envs: int, seed: int) -> BatchedEnv:
    """`num_envs` envs of `cfg.id`, deterministic given `seed` (a non-negative int)."""
    if num_envs <= 0:
        raise ConfigError(f"num_envs must be positive, got {num_envs}")
    if resolve_backend(cfg) == "envpool":
        from podrace.envs.envpool_backend import EnvpoolEnv

        return EnvpoolEnv(cfg, num_envs, seed)
    from podrace.envs.gymnasium_backend import GymnasiumEnv

    return GymnasiumEnv(cfg, num_envs, seed)


def env_spec(cfg: EnvConfig) -> EnvSpec:
    """Shapes, dtypes and action bounds of one env of `cfg.id`, as `make_env` would build it."""
    if resolve_backend(cfg) == "envpool":
        from podrace.envs.envpool_backend import envpool_spec

        return envpool_spec(cfg)
    from podrace.envs.gymnasium_backend import gymnasium_spec

    return gymnasium_spec(cfg)
