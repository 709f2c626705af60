"""Where a subscriber puts its snapshots: placing, naming and pickling of jax devices/shardings."""

from __future__ import annotations

from typing import Any

import jax

Placement = Any  # jax.Device, jax.sharding.Sharding, or None (leave arrays where they are)
DeviceKey = tuple[str, int] | None


def local_copy(tree: Any) -> Any:
    """This process's copy of replicated global arrays (actors place it on their devices).

    A replicated array over a multi-process mesh cannot be moved as a whole; any one of
    its addressable shards is the full value. Single-process arrays pass through.
    """

    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return x.addressable_shards[0].data
        return x

    return jax.tree.map(one, tree)


def on_device(tree: Any, device: jax.Device) -> bool:
    """Every leaf of `tree` is a jax.Array that lives on `device` alone (whatever sharding
    object says so: a one-device mesh is that device too)."""
    target = {device}
    return all(isinstance(x, jax.Array) and x.devices() == target for x in jax.tree.leaves(tree))


def place(tree: Any, where: Placement) -> Any:
    """`jax.device_put(tree, where)`, without its cost for a tree already on the one device
    `where`: device_put takes about 25 us per leaf on XLA:CPU even when nothing moves (a CPU
    actor sharing the learner's device would pay it for every version and rollout). Such a
    tree comes back as device_put would give it, each leaf a SingleDeviceSharding array
    (a view of the same buffer), so compiled programs see the shardings they were compiled
    for whichever way their inputs were placed."""
    if where is None:
        return tree
    if isinstance(where, jax.Device) and on_device(tree, where):
        return jax.tree.map(_single_device_view, tree)
    if _leaves_an_accelerator(tree, where):
        # JAX copies from an accelerator to another platform (a GPU learner's params to CPU
        # actors) through host memory, which the runtime threads' transfer guard counts as
        # an implicit transfer: fetch to the host explicitly, then put. (CPU to GPU goes
        # directly: allowed, and faster than through numpy: 559 against 947 us for a
        # CartPole rollout on an H200 machine.)
        return jax.device_put(jax.device_get(tree), where)
    return jax.device_put(tree, where)


def _leaves_an_accelerator(tree: Any, where: Any) -> bool:
    """Some array of `tree` lives on a non-CPU platform that `where` (a device, a
    sharding, or a tree of them) has no device of."""
    targets = {
        d.platform
        for w in jax.tree.leaves(
            where, is_leaf=lambda x: isinstance(x, (jax.Device, jax.sharding.Sharding))
        )
        for d in ((w,) if isinstance(w, jax.Device) else w.device_set)
    }
    return any(
        d.platform not in targets and d.platform != "cpu"
        for x in jax.tree.leaves(tree)
        if isinstance(x, jax.Array)
        for d in x.devices()
    )


def _single_device_view(x: jax.Array) -> jax.Array:
    return x if isinstance(x.sharding, jax.sharding.SingleDeviceSharding) else x.addressable_data(0)


def placement_name(where: Placement) -> str:
    """Short metric-friendly name of a device or sharding."""
    if where is None:
        return "published"
    if isinstance(where, jax.Device):
        return f"{where.platform}{where.id}"
    return type(where).__name__ + "".join(
        f"_{d.id}" for d in sorted(where.device_set, key=lambda d: d.id)
    )


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
