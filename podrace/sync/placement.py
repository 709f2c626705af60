"""Where a subscriber puts its snapshots: naming and pickling of jax devices/shardings."""

from __future__ import annotations

from typing import Any

import jax

Placement = Any  # jax.Device, jax.sharding.Sharding, or None (leave arrays where they are)
DeviceKey = tuple[str, int] | None


def placement_name(where: Placement) -> str:
    """Short metric-friendly name of a device or sharding."""
    if where is None:
        return "published"
    if isinstance(where, jax.Device):
        return f"{where.platform}{where.id}"
    return type(where).__name__ + "".join(f"_{d.id}" for d in sorted(where.device_set, key=lambda d: d.id))


def device_key(device: Placement) -> DeviceKey:
    """A picklable stand-in for `device` (subscribers travel to other processes)."""
    if device is None:
        return None
    if isinstance(device, jax.Device):
        return (device.platform, device.id)
    raise TypeError("a subscriber sent to another process can only carry a jax.Device or None")


def device_from_key(key: DeviceKey) -> Placement:
    """The device `key` names, looked up in this process."""
    if key is None:
        return None
    platform, dev_id = key
    for device in jax.devices(platform):
        if device.id == dev_id:
            return device
    raise ValueError(f"no {platform} device with id {dev_id} in this process")
