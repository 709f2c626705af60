"""The served-actor fleet (`--env.workers N`): env workers step the envs, inference threads
choose every actor's actions.

Actor `i` = N env workers (each stepping a part of its envs: processes on this host,
`podrace.envs.workers`, or Ray actors on any node, `podrace.runtime.ray.served`) + the
thread that hands its rollouts to the pipeline (`ServedActor.run`, named `actor-i` like an
actor thread). Whoever infers drives every worker through its `EnvLink`. Actions come from
inference threads (`podrace.inference.server`), which get the params by push from the
run's publisher:

- `--layout.inference actor`: one per actor (`actor-i.inference`), on the actor's device,
  serving only that actor's workers (while one part steps, the other's next actions are
  computed);
- `--layout.inference server`: one per actor device (`server-d`), batching the requests of
  every actor on it into one policy call.

Everything else is `LocalActors`' (as for actor threads): keys and env seeds per actor
(each worker's envs are seeded as that part of the actor's envs would be in its thread, so
the same episodes are played), the sink, checkpoints, resume.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from podrace.algos.normalizer import acting_apply
from podrace.config import TrainConfig
from podrace.envs.worker_protocol import EnvLink, EnvLinkMaker, wait_readable
from podrace.envs.workers import EnvWorker, split_envs
from podrace.inference.batching import ServerSettings
from podrace.inference.policy import make_key_chain, make_serve_fn
from podrace.inference.rollouts import ServedActor
from podrace.inference.server import InferenceServer
from podrace.runtime.build import actor_env_seed, actor_settings
from podrace.runtime.threads.actors import DeviceOf, LocalActors, packed_device


class WorkerGroup:
    """One actor's env workers, closed together (as an actor's env is)."""

    def __init__(self, workers: list[EnvLink]) -> None:
        self.workers = workers

    def close(self) -> None:
        for worker in self.workers:
            worker.close()


class ServedActors:
    """Env workers, inference threads and actor threads of this process's actors."""

    def __init__(
        self,
        make_worker: Callable[[TrainConfig], EnvLinkMaker] = lambda cfg: EnvWorker,
        device_of: DeviceOf = packed_device,
    ) -> None:
        self.make_worker = make_worker
        """config -> how to start an env worker: a process here (`EnvWorker`), or a Ray
        actor on any node (`podrace.runtime.ray.served.ray_env_workers`)."""
        self.local = LocalActors(device_of).lend_to(self)  # as actor threads do
        self.workers: dict[int, list[EnvLink]] = {}
        self.actors: list[ServedActor] = []
        self.servers: list[InferenceServer] = []

    def start(self) -> None:
        """Start every actor's workers (they build their envs meanwhile)."""
        ctx = self.local.ctx
        cfg, make = ctx.cfg, self.make_worker(ctx.cfg)
        threads = cfg.env.num_threads or 1  # envpool: a worker is already a core's worth
        parts = split_envs(cfg.env.num_envs, cfg.env.workers)
        for actor_id in range(cfg.num_actors):
            seed = actor_env_seed(cfg, actor_id, ctx.version())
            self.workers[actor_id] = [
                make(
                    f"actor-{actor_id}.w{j}",
                    ctx.envs,
                    ctx.spec,
                    cfg.env.num_envs,
                    seed,
                    part,
                    threads,
                )
                for j, part in enumerate(parts)
            ]
        for workers in self.workers.values():
            for worker in workers:
                ctx.lifetime.check()
                worker.start()

    def ready(self) -> None:
        """Wait for the workers, build the actors and inference threads, compile."""
        ctx, local = self.local.ctx, self.local
        cfg, lifetime = ctx.cfg, ctx.lifetime
        for workers in self.workers.values():
            for worker in workers:
                start, limit = time.monotonic(), worker.start_timeout_s
                while not wait_readable([worker.fileno()], 0.25):  # a stop is seen meanwhile
                    lifetime.check()
                    if time.monotonic() - start > limit:
                        raise TimeoutError(
                            f"env worker {worker.name} did not build its envs within {limit:g}s"
                        )
                worker.wait_started(0)
        sink, keys = local.sink(), local.keys()
        for actor_id, workers in self.workers.items():
            settings = actor_settings(cfg, actor_id, ctx.version(), keys[actor_id])
            name = f"actor-{actor_id}"
            self.actors.append(
                ServedActor(
                    settings,
                    ctx.spec,
                    cfg.env.num_envs,
                    workers,
                    sink,
                    ctx.control(name),
                    ctx.heartbeat,
                    local.device(actor_id),
                )
            )
        settings, serve_fn = self._server_settings(), self._serve_fn()  # one program for all
        key_chain = make_key_chain(cfg.rollout_length)
        ctx.metrics.count("env/worker_restarts", 0)  # in every line, 0 included
        for name, actors in self._server_groups().items():
            server = InferenceServer(
                name,
                settings,
                actors,
                serve_fn,
                key_chain,
                actors[0].device,
                ctx.control(name),
            )
            # A running total: a resumed run's continues (checkpointed with the counters).
            server.on_restart = lambda: ctx.metrics.count("env/worker_restarts")
            self.servers.append(server)
            lifetime.check()
            server.warm_up(ctx.published)
            ctx.publisher.add_push_target(
                server.push, name, on_error=lambda who, error: lifetime.fail(who, error)
            )

    def _server_groups(self) -> dict[str, list[ServedActor]]:
        """The actors each inference thread serves, by the thread's name."""
        ctx, groups = self.local.ctx, {}
        for actor in self.actors:
            if ctx.cfg.layout.inference == "server":
                index = list(ctx.devices.actors).index(actor.device)
                name = f"server-{index}"
            else:
                name = f"actor-{actor.actor_id}.inference"
            groups.setdefault(name, []).append(actor)
        return groups

    def _serve_fn(self) -> Callable:
        ctx = self.local.ctx
        cfg = ctx.cfg
        apply = acting_apply(ctx.network.apply, cfg.normalize)
        return make_serve_fn(apply, cfg.env.num_envs, cfg.env.num_envs // cfg.env.workers)

    def _server_settings(self) -> ServerSettings:
        cfg = self.local.ctx.cfg
        return ServerSettings(
            rollout_length=cfg.rollout_length,
            max_policy_lag=cfg.max_policy_lag,
            max_batch=cfg.inference.max_batch,
            max_wait_s=cfg.inference.max_wait_ms / 1000,
            fixed_order=cfg.deterministic,
            params_timeout_s=cfg.inference.params_timeout_s,
            worker_restarts=cfg.env.worker_restarts,
        )

    def loops(self) -> list[tuple[str, Callable[[], None]]]:
        return [(s.name, s.run) for s in self.servers] + [
            (f"actor-{a.actor_id}", a.run) for a in self.actors
        ]

    def env_owners(self) -> list[tuple[str, Any]]:
        """Each actor's workers; a worker is closed with the thread that steps it (an
        inference thread stuck in a call leaves its workers to the process's exit)."""
        return [(f"actor-{i}", WorkerGroup(workers)) for i, workers in self.workers.items()]

    def line_extras(self) -> dict[str, float]:
        return {}  # worker restarts are a counter (`env/worker_restarts`)

    def report(self) -> None:
        return None

    def close(self) -> None:
        for workers in self.workers.values():
            for worker in workers:
                worker.close()
        for server in self.servers:
            server.close()


__all__ = ["ServedActors", "WorkerGroup"]
