"""Envs written in JAX (`--env.backend jax`): which env an id names, checked before threads start.

Ids: `gymnax:<name>` (`gymnax.make`), `craftax:<name>` (Craftax's env without autoreset,
its default params), and `module:factory` for a user's env, the factory called with no
arguments and returning `(env, params)` as `gymnax.make` does. An env implements gymnax's
`Environment` interface: `reset_env(key, params) -> (obs, state)`, `step_env(key, state,
action, params) -> (obs, state, reward, done, info)`, `observation_space(params)` and
`action_space(params)`. Only those are used: podrace does the autoreset itself (next-step,
as every backend), so gymnax's own `step` (same-step autoreset) is not called.

Loading an env imports its package; checking it traces one env's reset and step with
`jax.eval_shape` (nothing runs), so an env whose step cannot be jitted is one line before
any thread starts.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from typing import Any, NamedTuple

import jax
import numpy as np

from podrace.config import ConfigError, EnvConfig
from podrace.envs.deferred_imports import defer
from podrace.envs.spaces import ObsIndices
from podrace.envs.user_modules import import_failure, make_working_dir_importable, split_env_id
from podrace.types import EnvSpec

INTERFACE = ("reset_env", "step_env", "observation_space", "action_space")
"""What podrace calls on a JAX env (gymnax's `Environment` interface)."""


class JaxEnv(NamedTuple):
    """A JAX env and the params every call passes it; `name` is the id, for messages;
    `obs_indices` the entries of each observation kept (`EnvConfig.obs_indices`)."""

    env: Any
    params: Any
    name: str
    obs_indices: tuple[int, ...] | None = None


def load_jax_env(cfg: EnvConfig) -> JaxEnv:
    """The env `cfg.id` names, with `cfg.max_episode_steps` applied; ConfigError (one line)
    for a missing package, an unknown name or a factory that does not return an env."""
    module, name = _split(cfg.id)
    if module == "gymnax":
        env, params = _from_gymnax(cfg.id, name)
    elif module == "craftax":
        env, params = _from_craftax(cfg.id, name)
    else:
        env, params = _from_factory(cfg.id, module, name)
    missing = [attr for attr in INTERFACE if not callable(getattr(env, attr, None))]
    if missing:
        raise ConfigError(
            f"env.id {cfg.id!r}: the factory returned {type(env).__name__}, which lacks "
            f"{', '.join(missing)}: expected (env, params), env implementing gymnax's "
            "Environment interface"
        )
    if cfg.max_episode_steps is not None:
        params = _with_time_limit(cfg.id, params, cfg.max_episode_steps)
    return JaxEnv(env, params, cfg.id, cfg.obs_indices)


def _split(env_id: str) -> tuple[str, str]:
    module, name = split_env_id(env_id)
    if module is None:
        raise ConfigError(
            f"env.id {env_id!r} with env.backend jax must be 'gymnax:<name>', "
            "'craftax:<name>' or 'module:factory'"
        )
    return module, name


def _import_package(env_id: str, package: str) -> Any:
    try:
        return importlib.import_module(package)
    except ImportError:
        raise ConfigError(
            f"env.id {env_id!r} needs the {package} package: pip install 'podrace[{package}]'"
        ) from None


GYMNAX_RENDERING = ("matplotlib.pyplot", "seaborn")
"""What gymnax imports only to render: imported when a render first uses it."""


def _from_gymnax(env_id: str, name: str) -> tuple[Any, Any]:
    if "gymnax" not in sys.modules and importlib.util.find_spec("gymnax") is not None:
        defer(GYMNAX_RENDERING)
    gymnax = _import_package(env_id, "gymnax")
    if name not in gymnax.registered_envs:
        raise ConfigError(
            f"env.id {env_id!r}: gymnax has no env {name!r} (see gymnax.registered_envs)"
        )
    return gymnax.make(name)


def _from_craftax(env_id: str, name: str) -> tuple[Any, Any]:
    _import_package(env_id, "craftax")
    from craftax.craftax_env import make_craftax_env_from_name

    try:
        env = make_craftax_env_from_name(name, auto_reset=False)
    except ValueError as error:
        raise ConfigError(f"env.id {env_id!r}: {error}") from None
    return env, env.default_params


def _from_factory(env_id: str, module: str, name: str) -> tuple[Any, Any]:
    """`module.name()`, a user's factory: its module imported (from the working directory
    too), its result checked to be a pair."""
    make_working_dir_importable(env_id)
    try:
        found = importlib.import_module(module)
    except (Exception, SystemExit) as error:  # the user's module: any error is its own
        raise ConfigError(
            f"env.id {env_id!r}: importing module {module!r} failed{import_failure(error)}"
        ) from None
    factory = getattr(found, name, None)
    if not callable(factory):
        raise ConfigError(f"env.id {env_id!r}: module {module!r} has no callable {name!r}")
    try:
        made = factory()
    except Exception as error:  # the user's factory: its error, in one line
        raise ConfigError(f"env.id {env_id!r}: the factory raised{import_failure(error)}") from None
    if not (isinstance(made, tuple) and len(made) == 2):
        raise ConfigError(
            f"env.id {env_id!r}: the factory returned {type(made).__name__}; expected "
            "(env, params) as gymnax.make returns, env implementing gymnax's Environment "
            "interface"
        )
    return made


def _with_time_limit(env_id: str, params: Any, steps: int) -> Any:
    """`params` with `max_steps_in_episode = steps` (gymnax's time-limit field)."""
    if not hasattr(params, "max_steps_in_episode"):
        raise ConfigError(
            f"env.max_episode_steps: the params of {env_id!r} ({type(params).__name__}) have no "
            "max_steps_in_episode field to set"
        )
    if hasattr(params, "replace"):
        return params.replace(max_steps_in_episode=steps)
    return dataclasses.replace(params, max_steps_in_episode=steps)


def _traced(env: JaxEnv, what: str, fn: Any, *args: Any) -> Any:
    """`jax.eval_shape(fn, *args)`; ConfigError (one line) where it cannot be traced."""
    try:
        return jax.eval_shape(fn, *args)
    except Exception as error:  # the user's env: its tracing error, in one line
        text = " ".join(f"{type(error).__name__}: {error}".split())
        text = text if len(text) <= 300 else f"{text[:297]}..."
        raise ConfigError(f"env.id {env.name!r}: its {what} cannot be jitted ({text})") from None


def jax_env_spec(env: JaxEnv) -> EnvSpec:
    """One env's shapes, dtypes and actions as podrace sees them (`obs_indices` applied)."""
    raw = raw_jax_env_spec(env)
    select = kept_observations(env, raw)
    return raw if select is None else select.spec(raw)


def kept_observations(env: JaxEnv, raw: EnvSpec) -> ObsIndices | None:
    """The selection of `env.obs_indices` from observations `raw` describes; None: all."""
    return ObsIndices.of(env.obs_indices, raw, env.name)


def raw_jax_env_spec(env: JaxEnv) -> EnvSpec:
    """One env's shapes, dtypes and actions, from its spaces and a traced reset and step."""
    key = jax.ShapeDtypeStruct((2,), np.uint32)
    obs, state = _traced(env, "reset_env", lambda k: env.env.reset_env(k, env.params), key)
    space = env.env.action_space(env.params)
    if hasattr(space, "n"):
        num_actions, action_shape, low, high = int(space.n), (), None, None
        action = jax.ShapeDtypeStruct((), np.int32)
    elif hasattr(space, "shape") and hasattr(space, "low"):
        num_actions, action_shape = None, tuple(space.shape)
        low = np.broadcast_to(np.asarray(space.low, np.float32), action_shape).copy()
        high = np.broadcast_to(np.asarray(space.high, np.float32), action_shape).copy()
        action = jax.ShapeDtypeStruct(action_shape, np.float32)
    else:
        raise ConfigError(
            f"env.id {env.name!r}: unsupported action space {type(space).__name__} "
            "(supported: Discrete (n) or Box (shape, low, high))"
        )
    out = _traced(
        env,
        "step_env",
        lambda k, s, a: env.env.step_env(k, s, a, env.params),
        key,
        state,
        action,
    )
    if not isinstance(obs, jax.ShapeDtypeStruct) or len(out) != 5:
        raise ConfigError(
            f"env.id {env.name!r}: reset_env must return (obs array, state) and step_env "
            "(obs, state, reward, done, info)"
        )
    return EnvSpec(tuple(obs.shape), np.dtype(obs.dtype), num_actions, action_shape, low, high)
