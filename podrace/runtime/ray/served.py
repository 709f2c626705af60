"""Env-only Ray workers served from the learner's host (`--runtime ray --layout.inference
server`).

Ray workers that act on CPU cannot feed an accelerator learner with Atari data: their
policy is the bottleneck. Here a Ray worker only steps envs (`RayEnvWorker`: a part of one
actor's envs, on any node with a free CPU); the actors' rollouts are assembled, and their
actions chosen, by inference servers on this process's actor devices
(`podrace.inference.server`, a GPU when there is one): the served-actor fleet
(`runtime.threads.served.ServedActors`) with env worker processes, but for the link to an
env worker. `RayEnvLink` (an `EnvLink`) calls its Ray actor (`reset`, `step` with the
actions) and a thread of the link waits for each answer, copies it into the link's
buffers and makes the link's pipe readable, so the server polls Ray workers and processes
alike (`ray_env_workers` makes them for the fleet).

Actor `i` of `ray.num_workers` has `env.workers` Ray env workers; a dead one (its process
killed, its node lost) is restarted by the server like a dead process, with fresh seeds,
up to `env.worker_restarts` times.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from podrace.config import ConfigError, TrainConfig
from podrace.envs.worker_protocol import (
    RESET,
    STEP,
    EnvLinkMaker,
    LinkBookkeeping,
    StepBuffers,
    WorkerSpec,
)
from podrace.envs.workers import EnvWorkerDied, EnvWorkerError
from podrace.runtime.ray.driver import RayDriver
from podrace.types import EnvStep
from podrace.validation import worker_resources


class RayEnvWorker:
    """The body of one env-only Ray worker (wrapped with `ray.remote`: `ray_env_workers`)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.env = None

    def start(self) -> tuple[str, int]:
        """Build the envs (errors reach the caller as this call's); (node id, pid)."""
        import ray

        self.env = self.spec.build()
        return ray.get_runtime_context().get_node_id(), os.getpid()

    def reset(self) -> np.ndarray:
        return self.env.reset()

    def step(self, actions: np.ndarray) -> tuple:
        return tuple(self.env.step(actions))


class RayEnvLink(LinkBookkeeping):
    """The server's side of one env-only Ray worker: an `EnvLink` over Ray calls."""

    def __init__(self, name: str, worker: WorkerSpec, remote: Any, options: dict) -> None:
        super().__init__(name, worker)
        self._remote, self._options = remote, options
        size, n = StepBuffers.size(self.spec, len(self.part)), len(self.part)
        self.buffers = StepBuffers(bytearray(size), self.spec, n)
        self._reply_r, self._reply_w = os.pipe()
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._answers: collections.deque = collections.deque()
        self._thread = threading.Thread(target=self._wait_answers, name=name, daemon=True)
        self._thread.start()
        self.handle: Any = None
        self.node, self.pid = "", 0

    def start(self) -> None:
        self.handle = self._remote.options(**self._options).remote(self._worker_spec)
        self._submit(b"start", self.handle.start.remote())

    def send(self, command: bytes) -> None:
        if command == STEP:
            self._submit(command, self.handle.step.remote(np.array(self.buffers.actions)))
        elif command == RESET:
            self._submit(command, self.handle.reset.remote())
        else:
            raise ValueError(f"unknown command {command!r}")

    def _submit(self, command: bytes, ref: Any) -> None:
        self._sent.append(command)
        self._calls.put(ref)

    def _wait_answers(self) -> None:
        import ray

        while True:
            ref = self._calls.get()
            if ref is None:
                return
            try:
                answer = (True, ray.get(ref))
            except BaseException as error:  # noqa: BLE001 - handed to read_reply
                answer = (False, error)
            self._answers.append(answer)
            try:
                os.write(self._reply_w, b"x")
            except OSError:
                return  # closed meanwhile

    def read_reply(self) -> bytes:
        """Finish the oldest call: its answer into the buffers; errors as `EnvWorker`'s."""
        import ray

        os.read(self._reply_r, 1)
        command = self._sent.popleft()
        ok, value = self._answers.popleft()
        if ok:
            b = self.buffers
            if command == b"start":
                self.node, self.pid = value
            elif command == RESET:
                b.write_reset(value)
            else:
                b.write(EnvStep(*value))
            return command
        what = {b"start": "building its envs", RESET: "env.reset", STEP: "env.step"}[command]
        if isinstance(value, ray.exceptions.RayTaskError):
            cause = getattr(value, "cause", None) or value
            if isinstance(cause, ConfigError):
                raise ConfigError(str(cause))
            text = str(cause).strip().splitlines()
            raise EnvWorkerError(
                f"{self.name}: {what} raised {type(cause).__name__}: {text[0] if text else ''}"
            )
        text = str(value).strip().splitlines()
        where = f"pid {self.pid} on node {self.node[:12]}" if self.pid else "starting"
        raise EnvWorkerDied(
            f"env worker {self.name} (Ray actor, {where}) died: "
            f"{type(value).__name__}: {text[0] if text else ''}"
        )

    @property
    def alive(self) -> bool:
        return self.handle is not None and not self.closed

    def kill(self) -> None:
        """Kill the Ray actor (tests, drills)."""
        import ray

        if self.handle is not None:
            with contextlib.suppress(Exception):
                ray.kill(self.handle, no_restart=True)

    def _drop_worker(self) -> None:
        self.kill()
        self.handle = None

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._drop_worker()
        self._calls.put(None)
        self._thread.join(5.0)
        for fd in (self._reply_r, self._reply_w):
            with contextlib.suppress(OSError):
                os.close(fd)


def ray_env_workers(driver: RayDriver) -> Callable[[TrainConfig], EnvLinkMaker]:
    """How the served fleet starts env workers in a Ray cluster: one Ray actor each, on any
    node with a free CPU (and the worker resources `--ray.*` asks for)."""

    def maker(cfg: TrainConfig) -> EnvLinkMaker:
        options = {
            "num_cpus": 1,
            "resources": worker_resources(cfg.ray),
            "max_restarts": 0,  # the server restarts it, with fresh seeds
            "runtime_env": {"env_vars": {"JAX_PLATFORMS": "cpu"}},
        }
        remote = driver.ray.remote(RayEnvWorker)

        def link(name, source, spec, num_envs, seed, part, threads) -> RayEnvLink:
            worker = WorkerSpec(source, num_envs, seed, part, threads, spec)
            made = RayEnvLink(name, worker, remote, options)
            made.start_timeout_s = cfg.ray.start_timeout_s
            return made

        return link

    return maker


def served_cpus(cfg: TrainConfig) -> int:
    """CPUs a private local Ray advertises for the served fleet: one per env worker."""
    return cfg.num_actors * cfg.env.workers


__all__ = ["RayEnvLink", "RayEnvWorker", "ray_env_workers", "served_cpus"]
