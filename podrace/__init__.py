"""podrace: decoupled actor-learner reinforcement learning in JAX.

The public API:

    import dataclasses, podrace

    cfg = podrace.presets.get("cartpole-ppo")
    cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, id="my_module:MyEnv-v0"))
    result = podrace.train(cfg)          # TrainResult: run_dir, updates, final_eval, ...

Config classes (`TrainConfig`, `EnvConfig`, ...) and `ConfigError` come from
`podrace.config`; `podrace.presets`, `podrace.sync` and `podrace.envs` are submodules.
Everything is imported on first use, so `import podrace` and reading configs never
import JAX (the caller may still set XLA_FLAGS after importing podrace).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> module that defines it; resolved on first attribute access (PEP 562).
_LAZY = {
    **dict.fromkeys(
        (
            "ConfigError",
            "EnvConfig",
            "EvalConfig",
            "ImpalaConfig",
            "InferenceConfig",
            "LayoutConfig",
            "LogConfig",
            "NetworkConfig",
            "NormalizeConfig",
            "PPOConfig",
            "SafetyConfig",
            "TrainConfig",
        ),
        "podrace.config",
    ),
    "TrainResult": "podrace.runtime.result",
    "EvalResult": "podrace.evaluate",
    "BatchedEnv": "podrace.envs",
    "EnvFactory": "podrace.envs",
    "EnvSpec": "podrace.types",
    "EnvStep": "podrace.types",
}
_SUBMODULES = ("config", "envs", "presets", "sync")

__all__ = ["__version__", "train", *_LAZY, *_SUBMODULES]

if TYPE_CHECKING:
    from podrace import config, envs, presets, sync
    from podrace.config import (
        ConfigError,
        EnvConfig,
        EvalConfig,
        ImpalaConfig,
        InferenceConfig,
        LayoutConfig,
        LogConfig,
        NetworkConfig,
        NormalizeConfig,
        PPOConfig,
        SafetyConfig,
        TrainConfig,
    )
    from podrace.envs import BatchedEnv, EnvFactory
    from podrace.evaluate import EvalResult
    from podrace.runtime.result import TrainResult
    from podrace.types import EnvSpec, EnvStep


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"podrace.{name}")
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'podrace' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


def train(cfg: TrainConfig, env_factory: EnvFactory | None = None) -> TrainResult:
    """Train with `cfg` and return when done, in the topology the config asks for: threads
    on this host (the default), Ray workers (`runtime="ray"`), or one process of several
    (`distributed.*`: call this in every process, as the CLI runs in every process).

    Raises `ConfigError` (one line) for anything that cannot run, before any thread starts
    or any file is written. `cfg.env.id` may be any envpool id, any Gymnasium id registered
    before this call, or 'my_module:MyEnv-v0' (the module is imported first, so it can
    register the id). For several CPU devices (`cfg.layout.cpu_devices`), set
    XLA_FLAGS=--xla_force_host_platform_device_count=N before JAX is first imported.

    `env_factory(num_envs, seed)` returning a `BatchedEnv` or a `gymnasium.vector.VectorEnv`
    replaces `cfg.env.id`: actors and the evaluator build their envs with it (see
    `podrace.envs.EnvSource`); it is called once first, as a probe, to check the spaces.
    Ray workers build their envs from it too, so it must pickle (cloudpickle takes
    closures; one that does not is a ConfigError before Ray starts) and import on every
    node.

    Ctrl-C (in the main thread, with Python's own SIGINT handling) stops the run as the CLI
    does: the last update's state is saved and the run directory released (a run stopped
    before its first update leaves none), then KeyboardInterrupt is raised; a second Ctrl-C
    raises it at once.
    """
    from podrace.control import Lifetime
    from podrace.runtime.interrupts import interrupts_stop
    from podrace.validation import check_types

    check_types(cfg)  # before `cfg.env` is read below
    lifetime = Lifetime()
    with interrupts_stop(lifetime) as interrupted:  # a Ctrl-C during JAX's import too
        from podrace.envs import EnvSource
        from podrace.runtime.run import run_to_end

        return run_to_end(cfg, lifetime, interrupted, envs=EnvSource(cfg.env, env_factory))
