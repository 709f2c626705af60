"""Process set-up for XLA, done before JAX starts its backend: CPU device count, dispatch
mode, the persistent compilation cache. Used by the CLI and the benchmarks alike."""

from __future__ import annotations

import os

from podrace.config import ConfigError, TrainConfig


def append_xla_flag(flag: str, value: str) -> None:
    """Add `flag=value` to XLA_FLAGS unless the user already set that flag."""
    flags = os.environ.get("XLA_FLAGS", "")
    if flag not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {flag}={value}".strip()


def force_cpu_devices(count: int) -> None:
    """Set up XLA:CPU before its backend starts: `count` devices, synchronous dispatch.

    Synchronous dispatch runs a single-device computation on the calling thread. Every
    podrace loop waits for its results at once (an actor needs its actions), so async
    dispatch only added a hand-off to a pool thread per call: on 2 cores the actor's CPU
    time per CartPole step fell by about a quarter without it (benchmarks/cartpole_ppo.py).
    Multi-device computations (a sharded learner) are dispatched as before.
    """
    if count > 1:
        append_xla_flag("--xla_force_host_platform_device_count", str(count))
    import jax  # importing does not start a backend; the flags above are read when one starts

    jax.config.update("jax_cpu_enable_async_dispatch", False)


def default_compile_cache() -> str:
    """Where compiled programs are kept across runs unless JAX_COMPILATION_CACHE_DIR says."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "podrace", "xla")


def enable_compile_cache() -> None:
    """Keep compiled programs across runs (JAX's persistent compilation cache).

    A short run spends about a third of its time compiling; with the cache, the next run of
    the same config loads its programs instead (entries are keyed by the program, shapes,
    devices and JAX version, so a changed config simply compiles again). podrace's programs
    each compile in well under the 1 s below which JAX caches nothing by default, so every
    program is cached. JAX_COMPILATION_CACHE_DIR and
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS are respected; JAX_ENABLE_COMPILATION_CACHE=false
    turns the cache off. A cache that cannot be written costs a warning, never the run."""
    import jax

    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        jax.config.update("jax_compilation_cache_dir", default_compile_cache())
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def set_xla_flags(cfg: TrainConfig) -> None:
    """The XLA set-up a config asks for; before JAX starts its backend (later calls are no-ops)."""
    enable_compile_cache()
    if "cpu" in (cfg.layout.platform, cfg.layout.actor_platform) or cfg.layout.platform is None:
        force_cpu_devices(cfg.layout.cpu_devices)
    if cfg.deterministic:
        deterministic_gpu_ops()


DETERMINISTIC_OPS = "--xla_gpu_deterministic_ops"


def deterministic_gpu_ops() -> None:
    """XLA:GPU's deterministic kernels for a `deterministic` run (scatter-adds and reductions
    in a fixed order): the flag is read when JAX starts its backend. Set here if it has not
    started yet; a library caller whose process already started a GPU backend without it
    gets a ConfigError (that run could not be bit-identical). XLA:CPU is deterministic."""
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        append_xla_flag(DETERMINISTIC_OPS, "true")
        return
    if f"{DETERMINISTIC_OPS}=true" in os.environ.get("XLA_FLAGS", "") or not _gpu_started():
        return
    raise ConfigError(
        f"deterministic needs XLA_FLAGS={DETERMINISTIC_OPS}=true before JAX starts its GPU "
        "backend, and this process started it without: set it before the first JAX call "
        "(the podrace command sets it itself)"
    )


def _gpu_started() -> bool:
    import jax

    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:  # no GPU backend
        return False
