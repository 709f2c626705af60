"""The actor-thread fleet: one thread per actor steps its envs and acts on its device; and
`LocalActors`, what every fleet of actors in this process shares.

Params reach the actors through the `local` weight-sync transport (a reference per
version, placed once per actor device); each actor hands its rollouts to a `PlacingSink`,
which places them on the learner mesh from the actor's thread and queues them in the
pipeline. Actor `i` acts on device `actor_device_ids[i // actors_per_device]`
(`packed_device`).

Keys and seeds: actor `i` of process `p` is global actor `p * num_actors + i`; its key and
env seeds derive from (run seed, global id), so the processes of a multi-host run (each
with its own fleet) never share them. A checkpoint keeps the key every global actor
started the run with; a resumed run's actors start at the checkpoint's version with those
keys folded with it, and their envs restart with seeds that fold it in too, so a resumed
run differs from a straight one deterministically rather than replaying its first
rollouts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from podrace.actor import Actor
from podrace.checkpoints.state import RunState
from podrace.config import TrainConfig
from podrace.control import Lifetime
from podrace.pipeline import Pipeline, PlacingSink
from podrace.runtime.build import build_actor, dummy_trajectory, seed_key
from podrace.runtime.fleet import FleetContext, continued_version
from podrace.sync.local import LocalPublisher
from podrace.sync.placement import local_copy

DeviceOf = Callable[[TrainConfig, Sequence[jax.Device], int], jax.Device]
"""(config, actor devices, actor id) -> the device that actor acts on."""


def packed_device(cfg: TrainConfig, devices: Sequence[jax.Device], actor_id: int) -> jax.Device:
    """`layout.actors_per_device` actors on each actor device, in order."""
    return devices[actor_id // cfg.layout.actors_per_device]


def spread_device(cfg: TrainConfig, devices: Sequence[jax.Device], actor_id: int) -> jax.Device:
    """The actors spread evenly over the actor devices (actors served from this process
    whose envs step elsewhere: every device gets its share)."""
    return devices[actor_id * len(devices) // cfg.num_actors]


def per_actor_pipeline(cfg: TrainConfig, lifetime: Lifetime, first_seq: int) -> Pipeline:
    """One bounded queue per actor; update k takes rollout k of every actor."""
    return Pipeline(cfg.num_actors, cfg.layout.queue_size, cfg.max_policy_lag, lifetime, first_seq)


class LocalActors:
    """What the fleets of actors in this process share: params by the local transport, the
    per-actor pipeline, each actor's device, and where the actors start (keys, checkpoints,
    resume). A fleet holds one (composition)."""

    def __init__(self, device_of: DeviceOf = packed_device) -> None:
        self.device_of = device_of
        self.ctx: FleetContext | None = None
        self.start_keys: np.ndarray | None = None
        """The raw key of every global actor at the start of this run: [actors, 2]."""

    def lend_to(self, fleet: Any) -> LocalActors:
        """Make this object's publisher, pipeline, learner dummies, restore and save
        `fleet`'s own (`podrace.runtime.fleet.Fleet`'s methods of those names); returns it."""
        fleet.publisher, fleet.published, fleet.pipeline = (
            self.publisher,
            self.published,
            self.pipeline,
        )
        fleet.saved_actor_count, fleet.restore, fleet.save = (
            self.saved_actor_count,
            self.restore,
            self.save,
        )
        fleet.learner_dummies = self.learner_dummies
        return self

    def publisher(self, first_version: int) -> LocalPublisher:
        # Actors get this process's copy of the (possibly multi-process) replicated params.
        return LocalPublisher(transform=local_copy, first_version=first_version)

    def published(self, params: Any) -> Any:
        return local_copy(params)

    def pipeline(self, cfg: TrainConfig, lifetime: Lifetime, first_seq: int) -> Pipeline:
        return per_actor_pipeline(cfg, lifetime, first_seq)

    def saved_actor_count(self, cfg: TrainConfig, num_processes: int) -> int:
        return num_processes * cfg.num_actors

    def device(self, actor_id: int) -> jax.Device:
        ctx = self.ctx
        return self.device_of(ctx.cfg, ctx.devices.actors, actor_id)

    def restore(self, ctx: FleetContext, restored: RunState | None) -> dict:
        self.ctx = ctx
        count = self.saved_actor_count(ctx.cfg, ctx.num_processes)
        if restored is None:
            keys = [seed_key(ctx.cfg.seed, 2, g) for g in range(count)]
            version = 0
        else:
            what = f"the {ctx.topology} topology"
            version = continued_version(restored, count, "actor", what)
            keys = [jax.random.fold_in(k, version) for k in restored.actor_keys]
        self.start_keys = np.stack([np.asarray(jax.device_get(k)) for k in keys])
        return self.save(version)

    def keys(self) -> np.ndarray:
        """The start keys of this process's actors."""
        first = self.ctx.cfg.num_actors * self.ctx.process_id
        return self.start_keys[first : first + self.ctx.cfg.num_actors]

    def save(self, version: int) -> dict:
        count = len(self.start_keys)
        return {
            "actor_keys": self.start_keys,
            "actor_next_seq": (version,) * count,
            "actor_restarts": (0,) * count,
        }

    def learner_dummies(self) -> list:
        # Each actor's dummy from its own device: its rollouts' shardings, compiled for.
        ctx, placed = self.ctx, {}
        for device in ctx.devices.actors:
            ctx.lifetime.check()
            placed[device] = ctx.placement.place(dummy_trajectory(ctx.cfg, ctx.spec, device))
        return [placed[self.device(i)] for i in range(ctx.cfg.num_actors)]

    def sink(self) -> PlacingSink:
        return PlacingSink(self.ctx.pipeline, self.ctx.placement.place)


class ActorThreads:
    """One thread per actor (`podrace.actor.Actor`): it steps its envs and acts."""

    def __init__(self) -> None:
        self.local = LocalActors().lend_to(self)  # as served actors do
        self.actors: list[Actor] = []

    def start(self) -> None:
        pass  # an actor thread builds its envs in `ready`, after the learner compiled

    def ready(self) -> None:
        ctx, local = self.local.ctx, self.local
        sink, keys = local.sink(), local.keys()
        for actor_id in range(ctx.cfg.num_actors):
            ctx.lifetime.check()
            device = local.device(actor_id)
            name = f"actor-{actor_id}"
            params = ctx.publisher.subscribe(device=device, name=name)
            self.actors.append(
                build_actor(
                    ctx.cfg,
                    actor_id,
                    ctx.policy_fns.on(device),
                    ctx.faults.params(name, params),
                    sink,
                    ctx.control(name),
                    first_seq=ctx.version(),
                    envs=ctx.envs,
                    key=keys[actor_id],
                    wrap_env=ctx.faults.env,
                )
            )
        for actor in self.actors:
            ctx.lifetime.check()
            actor.warm_up(ctx.published)

    def loops(self) -> list[tuple[str, Callable[[], None]]]:
        return [(f"actor-{actor.actor_id}", actor.run) for actor in self.actors]

    def env_owners(self) -> list[tuple[str, Any]]:
        return [(f"actor-{actor.actor_id}", actor.env) for actor in self.actors]

    def line_extras(self) -> dict[str, float]:
        return {}

    def report(self) -> None:
        return None

    def close(self) -> None:
        pass  # the run closes the actors' envs (`env_owners`)


__all__ = [
    "ActorThreads",
    "DeviceOf",
    "LocalActors",
    "packed_device",
    "per_actor_pipeline",
    "spread_device",
]
