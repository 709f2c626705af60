"""Refuse a run whose network or rollout buffers cannot fit, before anything is allocated.

The params' shapes come from `jax.eval_shape` on the network's init (nothing is
allocated); the estimate counts what the learner keeps (params, gradients, optimizer
moments), a copy per actor device, and the rollouts the queues can hold.
"""

from __future__ import annotations

import math
import os

import jax
import numpy as np

from podrace.config import ConfigError, TrainConfig
from podrace.runtime.devices import Devices
from podrace.types import EnvSpec

LEARNER_COPIES = 4
"""Params, gradients and two optimizer moments (Adam; RMSProp keeps one)."""


def params_bytes(network, spec: EnvSpec) -> tuple[int, int]:
    """(parameter count, bytes) of `network`'s params for `spec`, without allocating them.
    ValueError naming the first empty parameter: a layer left with no inputs (an image too
    small for a torso's convolutions) would train a policy that never sees the observations."""
    obs = jax.ShapeDtypeStruct((1,) + tuple(spec.obs_shape), spec.obs_dtype)
    shapes = jax.eval_shape(network.init, jax.random.PRNGKey(0), obs)
    leaves = jax.tree_util.tree_leaves_with_path(shapes)
    for path, leaf in leaves:
        if math.prod(leaf.shape) == 0:
            raise ValueError(
                f"its parameter {jax.tree_util.keystr(path, simple=True, separator='/')} "
                f"would have shape {tuple(leaf.shape)} (no inputs left)"
            )
    count = sum(math.prod(leaf.shape) for _, leaf in leaves)
    return count, sum(math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize for _, leaf in leaves)


def rollout_bytes(cfg: TrainConfig, spec: EnvSpec) -> int:
    """Observations of every rollout alive at once: each actor's queue, plus one being
    filled and one being learned from."""
    obs = math.prod(spec.obs_shape) * np.dtype(spec.obs_dtype).itemsize
    return (
        cfg.num_actors * (cfg.layout.queue_size + 2) * cfg.rollout_length * cfg.env.num_envs * obs
    )


def host_available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (free + reclaimable), else free pages; None if unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # no /proc (not Linux): fall back to free pages below
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def device_available_bytes(device: jax.Device) -> int | None:
    stats = device.memory_stats() if device.platform != "cpu" else None
    if not stats or "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_fits(cfg: TrainConfig, network, spec: EnvSpec, devices: Devices) -> None:
    """ConfigError (one line) when the network cannot be built for the env's observations,
    or when params and rollouts need more memory than the devices (or host) have."""
    try:
        count, size = params_bytes(network, spec)
    except Exception as error:  # a torso that cannot take these observations
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(
            f"network.torso {cfg.network.torso} cannot take observations of shape "
            f"{tuple(spec.obs_shape)}: {first}"
        ) from None
    rollouts = rollout_bytes(cfg, spec)
    what = f"the network has {count:,} parameters ({_gib(size)})"
    platform = devices.learners[0].platform
    if platform == "cpu":
        need = LEARNER_COPIES * size * len(devices.learners) + size * len(devices.actors) + rollouts
        available, where = host_available_bytes(), "host memory"
    else:
        need = LEARNER_COPIES * size + rollouts // len(devices.learners)
        limits = [device_available_bytes(d) for d in devices.learners]
        available = None if None in limits else min(limits)
        where = f"{platform} learner device memory"
    if available is not None and need > available:
        knobs = "network.hidden_sizes, env.num_envs, rollout_length"
        if len(spec.obs_shape) >= 2:
            knobs += ", env.image_size, env.frame_stack"
        raise ConfigError(
            f"{what}; params, optimizer state and rollouts need about {_gib(need)} "
            f"but {where} has {_gib(available)} available ({knobs})"
        )
