"""Map the config's device ids to JAX devices, with clear errors for impossible layouts."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import jax

from podrace.config import ConfigError, TrainConfig

CPU_COUNT_FLAG = "--xla_force_host_platform_device_count"


def cpu_count_hint(environ: dict[str, str] = os.environ) -> str:
    """How to get more CPU devices, naming a device count already set in XLA_FLAGS (which
    the CLI never replaces, so --layout.cpu-devices cannot raise it)."""
    match = re.search(rf"{CPU_COUNT_FLAG}=(\S*)", environ.get("XLA_FLAGS", ""))
    if match:
        return (
            f" (XLA_FLAGS already sets {CPU_COUNT_FLAG}={match.group(1)}, which "
            "--layout.cpu-devices does not override: change or remove it there)"
        )
    return (
        f" (more CPU devices: --layout.cpu-devices N, or from Python set "
        f"XLA_FLAGS={CPU_COUNT_FLAG}=N before importing jax)"
    )


@dataclass(frozen=True)
class Devices:
    actors: tuple[jax.Device, ...]
    learners: tuple[jax.Device, ...]
    evaluator: jax.Device


def resolve_devices(cfg: TrainConfig) -> Devices:
    layout = cfg.layout
    learner_devices = _local_devices("layout.platform", layout.platform)
    actor_devices = (
        learner_devices
        if layout.actor_platform in (None, layout.platform)
        else _local_devices("layout.actor_platform", layout.actor_platform)
    )

    def pick(name: str, ids, available: list[jax.Device]) -> tuple[jax.Device, ...]:
        platform = available[0].platform
        missing = [i for i in ids if i >= len(available)]
        if missing:
            hint = cpu_count_hint() if platform == "cpu" else ""
            raise ConfigError(
                f"{name} {list(ids)}: device {missing[0]} does not exist, "
                f"{platform} has {len(available)} device(s){hint}"
            )
        return tuple(available[i] for i in ids)

    actors = pick("layout.actor_device_ids", layout.actor_device_ids, actor_devices)
    learners = pick("layout.learner_device_ids", layout.learner_device_ids, learner_devices)
    eval_id = cfg.eval.device_id
    evaluator = (
        actors[0] if eval_id is None else pick("eval.device_id", (eval_id,), actor_devices)[0]
    )
    return Devices(actors=actors, learners=learners, evaluator=evaluator)


def _local_devices(name: str, platform: str | None) -> list[jax.Device]:
    """This process's devices of `platform` (all of them on one host; its own in a
    multi-host run), JAX's default backend for None."""
    try:
        return jax.local_devices(backend=platform) if platform else jax.local_devices()
    except RuntimeError as error:
        raise ConfigError(
            f"{name} '{platform}' is not available: {error}".splitlines()[0]
        ) from None
