"""Env-only Ray workers served from the learner's host (`--runtime ray --layout.inference
server`).

Ray workers that act on CPU cannot feed an accelerator learner with Atari data: their
policy is the bottleneck. Here a Ray worker only steps envs (`RayEnvWorker`: a part of one
actor's envs, on any node with a free CPU); the actors' rollouts are assembled, and their
actions chosen, by inference servers on this process's actor devices
(`podrace.inference.server`, a GPU when there is one), exactly as in the thread topology
with env worker processes (`runtime.threads.served`): the same servers, actors, keys,
seeds, sink, checkpoints. Only the link to an env worker differs: `RayEnvLink` calls its
Ray actor (`reset`, `step` with the actions) and a thread of the link waits for each
answer, copies it into the link's buffers and makes the link's pipe readable, so the
server polls Ray workers and processes alike.

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
from typing import Any

import numpy as np

from podrace.config import ConfigError, TrainConfig
from podrace.envs.source import EnvSource
from podrace.envs.worker_protocol import RESET, STEP, StepBuffers, WorkerSpec
from podrace.envs.workers import EnvWorkerDied, EnvWorkerError, restarted, wait_readable
from podrace.runtime.ray import cluster as ray_cluster
from podrace.runtime.threads.served import ServedActors
from podrace.runtime.threads.topology import ThreadTopology
from podrace.types import EnvSpec, EnvStep
from podrace.validation import worker_resources


class RayEnvWorker:
    """The body of one env-only Ray worker (wrapped with `ray.remote` by the topology)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.env = None

    def start(self) -> tuple[str, int]:
        """Build the envs (errors reach the caller as this call's); (node id, pid)."""
        import ray

        spec = self.spec
        self.env = spec.source.make_part(spec.num_envs, spec.seed, spec.part, spec.threads)
        got, want = self.env.spec, spec.expect
        if (tuple(got.obs_shape), np.dtype(got.obs_dtype), got.action_shape) != (
            tuple(want.obs_shape),
            np.dtype(want.obs_dtype),
            want.action_shape,
        ):
            raise RuntimeError(f"its envs have spec {got}, the run expects {want}")
        return ray.get_runtime_context().get_node_id(), os.getpid()

    def reset(self) -> np.ndarray:
        return self.env.reset()

    def step(self, actions: np.ndarray) -> tuple:
        return tuple(self.env.step(actions))


class RayEnvLink:
    """The server's side of one env-only Ray worker: `EnvWorker`'s interface (buffers,
    `fileno`, `send`, `read_reply`, `restart`, `close`) over Ray calls."""

    def __init__(
        self,
        name: str,
        source: EnvSource,
        spec: EnvSpec,
        num_envs: int,
        seed: int,
        part: range,
        threads: int | None,
        remote: Any,
        options: dict,
    ) -> None:
        self.name, self.spec, self.part = name, spec, part
        self._worker_spec = WorkerSpec(source, num_envs, seed, part, threads, spec)
        self._first_seed = seed
        self._remote, self._options = remote, options
        self.buffers = StepBuffers(bytearray(StepBuffers.size(spec, len(part))), spec, len(part))
        self._r, self._w = os.pipe()
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._answers: collections.deque = collections.deque()
        self._sent: collections.deque[bytes] = collections.deque()
        self._thread = threading.Thread(target=self._wait_answers, name=name, daemon=True)
        self._thread.start()
        self.handle: Any = None
        self.node, self.pid = "", 0
        self.restarts = 0
        self.closed = False
        self.start_timeout_s = 120.0

    def start(self) -> None:
        self.handle = self._remote.options(**self._options).remote(self._worker_spec)
        self._submit(b"start", self.handle.start.remote())

    def restart(self) -> None:
        self._kill()
        self.restarts += 1
        self._worker_spec = restarted(self._worker_spec, self._first_seed, self.restarts)
        self.start()

    def wait_started(self, timeout: float | None = None) -> None:
        timeout = self.start_timeout_s if timeout is None else timeout
        if not wait_readable([self._r], timeout):
            raise TimeoutError(f"{self.name}: its envs were not built within {timeout:g}s")
        self.read_reply()

    def fileno(self) -> int:
        return self._r

    @property
    def pending(self) -> int:
        return len(self._sent)

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
                os.write(self._w, b"x")
            except OSError:
                return  # closed meanwhile

    def read_reply(self) -> bytes:
        """Finish the oldest call: its answer into the buffers; errors as `EnvWorker`'s."""
        import ray

        os.read(self._r, 1)
        command = self._sent.popleft()
        ok, value = self._answers.popleft()
        if ok:
            b = self.buffers
            if command == b"start":
                self.node, self.pid = value
            elif command == RESET:
                b.obs[...] = value
                for name in ("reward", "episode_return", "episode_length"):
                    getattr(b, name)[...] = 0
                for name in ("terminated", "truncated", "episode_done"):
                    getattr(b, name)[...] = False
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

    def _kill(self) -> None:
        self.kill()
        self.handle = None

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._kill()
        self._calls.put(None)
        self._thread.join(5.0)
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)


class RayServedTopology(ThreadTopology):
    """The thread topology's served actors, their env workers Ray actors on any node."""

    name = "ray"
    stop_grace_s = 10.0  # as the Ray topology's: killing workers takes a moment
    exit_grace_s = 30.0

    def __init__(self) -> None:
        super().__init__()
        self._stack = contextlib.ExitStack()
        self._remote: Any = None
        self._cfg: TrainConfig | None = None
        self._cluster: ray_cluster.Cluster | None = None

    def check(self, cfg: TrainConfig) -> None:
        os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
        ray_cluster.import_ray()
        ray_cluster.check_auth_not_disabled()

    def check_envs(self, envs: EnvSource) -> None:
        ray_cluster.check_envs_sendable(envs)

    def join(self, cfg: TrainConfig, lifetime, resuming: bool) -> TrainConfig:
        import ray

        lifetime.check()
        workers = cfg.num_actors * cfg.env.workers
        self._cluster = self._stack.enter_context(ray_cluster.connect(cfg.ray, num_cpus=workers))
        self._remote = ray.remote(RayEnvWorker)
        self._cfg = cfg
        return cfg

    def actor_device(self, run, actor_id: int):
        devices = run.devices.actors
        return devices[actor_id * len(devices) // run.cfg.num_actors]

    def launch_actors(self, run) -> None:
        self._cluster.messages.attach(run.run_dir)
        options = {
            "num_cpus": 1,
            "resources": worker_resources(run.cfg.ray),
            "max_restarts": 0,  # the server restarts it, with fresh seeds
            "runtime_env": {"env_vars": {"JAX_PLATFORMS": "cpu"}},
        }

        def link(name, source, spec, num_envs, seed, part, threads):
            made = RayEnvLink(
                name, source, spec, num_envs, seed, part, threads, self._remote, options
            )
            made.start_timeout_s = run.cfg.ray.start_timeout_s
            return made

        self.served = ServedActors(make_worker=link)
        self.served.launch(run, run.learner.version)

    def close(self) -> None:
        super().close()
        self._stack.close()


__all__ = ["RayEnvLink", "RayEnvWorker", "RayServedTopology"]
