"""Map the config's device ids to JAX devices, with clear errors for impossible layouts."""

from __future__ import annotations

from dataclasses import dataclass

import jax

from podrace.config import ConfigError, TrainConfig


@dataclass(frozen=True)
class Devices:
    actors: tuple[jax.Device, ...]
    learners: tuple[jax.Device, ...]
    evaluator: jax.Device


def resolve_devices(cfg: TrainConfig) -> Devices:
    layout = cfg.layout
    try:
        # Ids index this process's devices (all of them on one host; its own in a multi-host run).
        available = jax.local_devices(backend=layout.platform) if layout.platform else jax.local_devices()
    except RuntimeError as error:
        raise ConfigError(f"layout.platform '{layout.platform}' is not available: {error}".splitlines()[0]) from None
    platform = available[0].platform

    def pick(name: str, ids) -> tuple[jax.Device, ...]:
        missing = [i for i in ids if i >= len(available)]
        if missing:
            hint = (
                " (more CPU devices: --layout.cpu-devices N, or from Python set "
                "XLA_FLAGS=--xla_force_host_platform_device_count=N before importing jax)"
                if platform == "cpu"
                else ""
            )
            raise ConfigError(
                f"{name} {list(ids)}: device {missing[0]} does not exist, "
                f"{platform} has {len(available)} device(s){hint}"
            )
        return tuple(available[i] for i in ids)

    actors = pick("layout.actor_device_ids", layout.actor_device_ids)
    learners = pick("layout.learner_device_ids", layout.learner_device_ids)
    eval_id = cfg.eval.device_id
    evaluator = actors[0] if eval_id is None else pick("eval.device_id", (eval_id,))[0]
    return Devices(actors=actors, learners=learners, evaluator=evaluator)
