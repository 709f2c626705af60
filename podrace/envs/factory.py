"""Build a BatchedEnv (or read an EnvSpec) for an EnvConfig on the backend it resolves to."""

from __future__ import annotations

import dataclasses

from podrace.config import ConfigError, EnvConfig
from podrace.envs.base import BatchedEnv
from podrace.envs.resolve import resolve_backend
from podrace.envs.user_modules import split_env_id
from podrace.types import EnvSpec


def _resolved(cfg: EnvConfig) -> tuple[str, EnvConfig]:
    """(backend, cfg with the bare id): resolving imports the module of a 'module:EnvId' id."""
    backend = resolve_backend(cfg)
    return backend, dataclasses.replace(cfg, id=split_env_id(cfg.id)[1])


def make_env(
    cfg: EnvConfig, num_envs: int, seed: int, seeds: list[int] | None = None
) -> BatchedEnv:
    """`num_envs` envs of `cfg.id`, deterministic given `seed` (a non-negative int);
    `seeds` gives each env its own seed instead (`len(seeds) == num_envs`)."""
    if num_envs <= 0:
        raise ConfigError(f"num_envs must be positive, got {num_envs}")
    if resolve_backend(cfg) == "jax":
        from podrace.envs.device_env import DeviceEnv
        from podrace.envs.jax_envs import load_jax_env

        if seeds is not None:
            raise ConfigError("JAX envs take one seed for the batch, not one per env")
        return DeviceEnv(load_jax_env(cfg), num_envs, seed)
    backend, cfg = _resolved(cfg)
    if backend == "envpool":
        from podrace.envs.envpool_backend import EnvpoolEnv

        return EnvpoolEnv(cfg, num_envs, seed, seeds)
    from podrace.envs.gymnasium_backend import make_gymnasium_env

    return make_gymnasium_env(cfg, num_envs, seed, seeds)


def env_spec(cfg: EnvConfig) -> EnvSpec:
    """Shapes, dtypes and action bounds of one env of `cfg.id`, as `make_env` would build it."""
    if resolve_backend(cfg) == "jax":
        from podrace.envs.jax_envs import jax_env_spec, load_jax_env

        return jax_env_spec(load_jax_env(cfg))
    backend, cfg = _resolved(cfg)
    if backend == "envpool":
        from podrace.envs.envpool_backend import envpool_spec

        return envpool_spec(cfg)
    from podrace.envs.gymnasium_backend import gymnasium_spec

    return gymnasium_spec(cfg)
