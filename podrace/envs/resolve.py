"""Which backend serves an env id, decided from the registries alone (no env is built).

This runs during config validation, before any thread starts, so it only looks ids up
(after importing the module of a 'module:EnvId' id, which registers the id).
"""

from __future__ import annotations

import functools

from podrace.config import ConfigError, EnvConfig, names_jax_package
from podrace.envs.user_modules import import_env_module

BACKENDS = ("auto", "envpool", "gymnasium", "jax")


@functools.cache
def envpool_ids() -> frozenset[str]:
    """Ids envpool can make; empty when envpool is not installed."""
    try:
        import envpool
    except ImportError:
        return frozenset()
    return frozenset(envpool.list_all_envs())


def gymnasium_has(env_id: str) -> bool:
    import gymnasium

    return env_id in gymnasium.registry


def is_envpool_atari(env_id: str) -> bool:
    """True for envpool's ALE games (by their implementation module, not the '-v5' suffix,
    which envpool's MuJoCo ids share)."""
    if env_id not in envpool_ids():
        return False
    from envpool.registration import registry

    return registry.specs[env_id][0] == "envpool.atari"


def resolve_backend(cfg: EnvConfig) -> str:
    """'envpool', 'gymnasium' or 'jax' for `cfg.id`; ConfigError (one line) when none fits.

    `auto` gives 'gymnax:<name>' and 'craftax:<name>' ids to the jax backend; with `jax`,
    any 'module:factory' id is a JAX env (`podrace.envs.jax_envs`), checked when it loads."""
    if cfg.backend not in BACKENDS:
        raise ConfigError(f"env.backend must be one of {', '.join(BACKENDS)}, got {cfg.backend!r}")
    if cfg.backend == "jax" or (cfg.backend == "auto" and names_jax_package(cfg.id)):
        return "jax"
    env_id = import_env_module(cfg.id)
    if cfg.backend == "envpool":
        if env_id not in envpool_ids():
            raise ConfigError(
                f"env id {cfg.id!r} is not an envpool id (see envpool.list_all_envs())"
            )
        return "envpool"
    if cfg.backend == "gymnasium":
        if not gymnasium_has(env_id):
            raise ConfigError(f"env id {cfg.id!r} is not registered with Gymnasium")
        return "gymnasium"
    if env_id in envpool_ids():
        return "envpool"
    if gymnasium_has(env_id):
        return "gymnasium"
    raise ConfigError(f"unknown env id {cfg.id!r} (not an envpool or Gymnasium id)")
