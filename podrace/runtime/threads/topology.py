"""The thread topology (one host): actors, learner and evaluator as threads of one process.

Params reach the actors through the `local` weight-sync transport (a reference per
version, placed once per actor device); each actor hands its rollouts to a `PlacingSink`,
which places them on the learner mesh from the actor's thread and queues them in the
pipeline. Actor `i` acts on device `actor_device_ids[i // actors_per_device]`.

Keys and seeds: actor `i` of process `p` is global actor `p * num_actors + i`; its key and
env seeds derive from (run seed, global id), so the processes of a multi-host run (which
is this topology in each process) never share them. A checkpoint keeps the key every
global actor started the run with; a resumed run's actors start at the checkpoint's
version with those keys folded with it, and their envs restart with seeds that fold it in
too, so a resumed run differs from a straight one deterministically rather than replaying
its first rollouts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from podrace.actor import Actor
from podrace.checkpoints.state import RunState
from podrace.config import ConfigError
from podrace.pipeline import PlacingSink
from podrace.runtime.build import build_actor, dummy_trajectory, seed_key
from podrace.runtime.threads.served import ServedActors
from podrace.runtime.topology import Topology
from podrace.sync.local import LocalPublisher
from podrace.sync.placement import local_copy


class ThreadTopology(Topology):
    name = "threads"

    def __init__(self) -> None:
        self.actors: list[Actor] = []
        self.served: ServedActors | None = None
        """The actors, their env worker processes and inference threads (--env.workers)."""
        self.start_keys: np.ndarray | None = None
        """The raw key of every global actor at the start of this run: [actors, 2]."""

    def publisher(self, run, first_version: int) -> LocalPublisher:
        # Actors get this process's copy of the (possibly multi-process) replicated params.
        return LocalPublisher(transform=local_copy, first_version=first_version)

    def published(self, params: Any) -> Any:
        return local_copy(params)

    def actor_device(self, run, actor_id: int) -> jax.Device:
        return run.devices.actors[actor_id // run.cfg.layout.actors_per_device]

    def learner_dummies(self, run) -> list:
        # Each actor's dummy from its own device: its rollouts' shardings, compiled for.
        placed = {}
        for device in run.devices.actors:
            run.lifetime.check()
            placed[device] = run.placement.place(dummy_trajectory(run.cfg, run.spec, device))
        return [placed[self.actor_device(run, i)] for i in range(run.cfg.num_actors)]

    def saved_actors(self, run) -> int:
        return self.num_processes * run.cfg.num_actors

    def actors_start(self, run, restored: RunState | None) -> dict:
        count = self.saved_actors(run)
        if restored is None:
            keys = [seed_key(run.cfg.seed, 2, g) for g in range(count)]
            version = 0
        else:
            version = restored.version
            if tuple(restored.actor_next_seq) != (version,) * count:
                raise ConfigError(
                    f"checkpoint {version} has actors' next rollouts "
                    f"{list(restored.actor_next_seq)}; the {self.name} topology resumes only "
                    f"where every actor continues at {version}"
                )
            keys = [jax.random.fold_in(k, version) for k in restored.actor_keys]
        self.start_keys = np.stack([np.asarray(jax.device_get(k)) for k in keys])
        return self.actors_saved(run, version)

    def actors_saved(self, run, version: int) -> dict:
        count = self.saved_actors(run)
        return {
            "actor_keys": self.start_keys,
            "actor_next_seq": (version,) * count,
            "actor_restarts": (0,) * count,
        }

    def launch_actors(self, run) -> None:
        if run.cfg.env.workers:
            self.served = ServedActors()
            self.served.launch(run, run.learner.version)

    def actors_ready(self, run) -> None:
        cfg, lifetime = run.cfg, run.lifetime
        if self.served is not None:
            first = cfg.num_actors * self.process_id
            keys = self.start_keys[first : first + cfg.num_actors]
            self.served.build(run, keys, lambda i: self.actor_device(run, i))
            return
        sink = PlacingSink(run.pipeline, run.placement.place)
        first = cfg.num_actors * self.process_id
        for actor_id in range(cfg.num_actors):
            lifetime.check()
            device = self.actor_device(run, actor_id)
            name = f"actor-{actor_id}"
            params = run.publisher.subscribe(device=device, name=name)
            self.actors.append(
                build_actor(
                    cfg,
                    actor_id,
                    run.policy_fns.on(device),
                    run.faults.params(name, params),
                    sink,
                    run.control(name),
                    first_seq=run.learner.version,
                    envs=run.envs,
                    key=self.start_keys[first + actor_id],
                    wrap_env=run.faults.env,
                )
            )
        for actor in self.actors:
            lifetime.check()
            actor.warm_up(run.published)

    def loops(self, run) -> list[tuple[str, Callable[[], None]]]:
        if self.served is not None:
            return self.served.loops()
        return [(f"actor-{actor.actor_id}", actor.run) for actor in self.actors]

    def env_owners(self, run) -> list[tuple[str, Any]]:
        if self.served is not None:
            return self.served.env_owners()
        return [(f"actor-{actor.actor_id}", actor.env) for actor in self.actors]

    def close(self) -> None:
        if self.served is not None:
            self.served.close()


__all__ = ["ThreadTopology"]
