"""The thread topology's actors when they have env workers (`--env.workers N`).

Actor `i` = N env worker processes (`podrace.envs.workers`, each stepping a part of its
envs) + the thread that hands its rollouts to the pipeline (`ServedActor.run`, named
`actor-i` like an actor thread). Actions come from inference threads
(`podrace.inference.server`), which get the params by push from the run's publisher:

- `--layout.inference actor`: one per actor (`actor-i.inference`), on the actor's device,
  serving only that actor's workers (while one part steps, the other's next actions are
  computed);
- `--layout.inference server`: one per actor device (`server-d`), batching the requests of
  every actor on it into one policy call.

Everything else is the thread topology's: keys and env seeds per actor (each worker's
envs are seeded as that part of the actor's envs would be in its thread, so the same
episodes are played), the sink, checkpoints (`actors_saved`), resume.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax

from podrace.algos.normalizer import acting_apply
from podrace.envs.workers import START_TIMEOUT_S, EnvWorker, split_envs, wait_readable
from podrace.inference.policy import make_key_chain, make_serve_fn
from podrace.inference.rollouts import ServedActor
from podrace.inference.server import InferenceServer, ServerSettings
from podrace.pipeline import PlacingSink
from podrace.runtime.build import actor_env_seed, actor_settings


class WorkerGroup:
    """One actor's env workers, closed together (as an actor's env is)."""

    def __init__(self, workers: list[EnvWorker]) -> None:
        self.workers = workers

    def close(self) -> None:
        for worker in self.workers:
            worker.close()


class ServedActors:
    """Env worker processes, inference threads and actor threads of one process's actors."""

    def __init__(self, make_worker: Callable[..., Any] = EnvWorker) -> None:
        self.make_worker = make_worker
        """(name, source, spec, num_envs, seed, part, threads) -> an env worker: a process
        here (`EnvWorker`), or a Ray actor on any node (`podrace.runtime.ray.served`)."""
        self.workers: dict[int, list[EnvWorker]] = {}
        self.actors: list[ServedActor] = []
        self.servers: list[InferenceServer] = []

    def launch(self, run, first_seq: int) -> None:
        """Start every actor's worker processes (they build their envs meanwhile)."""
        cfg = run.cfg
        threads = cfg.env.num_threads or 1  # envpool: a worker is already a core's worth
        parts = split_envs(cfg.env.num_envs, cfg.env.workers)
        for actor_id in range(cfg.num_actors):
            seed = actor_env_seed(cfg, actor_id, first_seq)
            self.workers[actor_id] = [
                self.make_worker(
                    f"actor-{actor_id}.w{j}",
                    run.envs,
                    run.spec,
                    cfg.env.num_envs,
                    seed,
                    part,
                    threads,
                )
                for j, part in enumerate(parts)
            ]
        for workers in self.workers.values():
            for worker in workers:
                run.lifetime.check()
                worker.start()

    def build(self, run, keys, device_of: Callable[[int], jax.Device]) -> None:
        """Wait for the workers, build the actors and inference threads, compile."""
        cfg, lifetime = run.cfg, run.lifetime
        for workers in self.workers.values():
            for worker in workers:
                start = time.monotonic()
                limit = getattr(worker, "start_timeout_s", START_TIMEOUT_S)
                while not wait_readable([worker.fileno()], 0.25):  # a stop is seen meanwhile
                    lifetime.check()
                    if time.monotonic() - start > limit:
                        raise TimeoutError(
                            f"env worker {worker.name} did not build its envs within {limit:g}s"
                        )
                worker.wait_started(0)
        sink = PlacingSink(run.pipeline, run.placement.place)
        for actor_id, workers in self.workers.items():
            settings = actor_settings(cfg, actor_id, run.learner.version, keys[actor_id])
            name = f"actor-{actor_id}"
            self.actors.append(
                ServedActor(
                    settings,
                    run.spec,
                    cfg.env.num_envs,
                    workers,
                    sink,
                    run.control(name),
                    run.watchdog.heartbeat,
                    device_of(actor_id),
                )
            )
        apply = acting_apply(run.network.apply, cfg.normalize)
        part_envs = cfg.env.num_envs // cfg.env.workers
        serve_fn = make_serve_fn(apply, cfg.env.num_envs, part_envs)
        key_chain = make_key_chain(cfg.rollout_length)
        settings = ServerSettings(
            rollout_length=cfg.rollout_length,
            max_policy_lag=cfg.max_policy_lag,
            max_batch=cfg.inference.max_batch,
            max_wait_s=cfg.inference.max_wait_ms / 1000,
            fixed_order=cfg.deterministic,
            params_timeout_s=cfg.inference.params_timeout_s,
            worker_restarts=cfg.env.worker_restarts,
        )
        groups: dict[str, list[ServedActor]] = {}
        for actor in self.actors:
            device = device_of(actor.actor_id)
            if cfg.layout.inference == "server":
                index = list(run.devices.actors).index(device)
                name = f"server-{index}"
            else:
                name = f"actor-{actor.actor_id}.inference"
            groups.setdefault(name, []).append(actor)
        run.metrics.count("env/worker_restarts", 0)  # in every line, 0 included
        for name, actors in groups.items():
            device = actors[0].device
            server = InferenceServer(
                name,
                settings,
                actors,
                serve_fn,
                key_chain,
                device,
                run.control(name),
            )
            # A running total: a resumed run's continues (checkpointed with the counters).
            server.on_restart = lambda: run.metrics.count("env/worker_restarts")
            self.servers.append(server)
            lifetime.check()
            server.warm_up(run.published)
            run.publisher.add_push_target(
                server.push, name, on_error=lambda who, error: lifetime.fail(who, error)
            )

    def loops(self) -> list[tuple[str, Callable[[], None]]]:
        return [(s.name, s.run) for s in self.servers] + [
            (f"actor-{a.actor_id}", a.run) for a in self.actors
        ]

    def env_owners(self) -> list[tuple[str, Any]]:
        """Each actor's workers; a worker is closed with the thread that steps it (an
        inference thread stuck in a call leaves its workers to the process's exit)."""
        return [(f"actor-{i}", WorkerGroup(workers)) for i, workers in self.workers.items()]

    def close(self) -> None:
        for workers in self.workers.values():
            for worker in workers:
                worker.close()
        for server in self.servers:
            server.close()


__all__ = ["ServedActors", "WorkerGroup"]
