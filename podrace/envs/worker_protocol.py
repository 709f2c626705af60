"""What both sides of an env worker share (`podrace.envs.workers` drives a worker,
`podrace.envs.worker_process` is one): the one-byte commands and replies, what a worker
builds (`WorkerSpec`), the shared-memory arrays of its envs' steps (`StepBuffers`), and
the link through which whoever infers drives a worker wherever it runs (`EnvLink`), with
the bookkeeping every such link keeps alike (`LinkBookkeeping`)."""

from __future__ import annotations

import collections
import dataclasses
import os
import pickle
import select
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from podrace.envs.base import BatchedEnv
from podrace.envs.source import EnvSource
from podrace.types import EnvSpec, EnvStep

RESET, STEP, CLOSE = b"r", b"s", b"c"
"""Commands, one byte each."""
OK, ERROR = b"k", b"e"
"""Replies: one byte, or ERROR followed by a length-prefixed message."""
_ALIGN = 64


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker process builds: envs `part` of an actor's `num_envs`, seeded `seed`."""

    source: EnvSource
    num_envs: int
    seed: int
    part: range
    threads: int | None
    expect: EnvSpec

    def build(self) -> BatchedEnv:
        """This worker's envs; RuntimeError if their observations or actions are not the
        ones the run expects (`expect`)."""
        env = self.source.make_part(self.num_envs, self.seed, self.part, self.threads)
        got, want = env.spec, self.expect
        if (tuple(got.obs_shape), np.dtype(got.obs_dtype), got.action_shape) != (
            tuple(want.obs_shape),
            np.dtype(want.obs_dtype),
            want.action_shape,
        ):
            raise RuntimeError(f"its envs have spec {got}, the run expects {want}")
        return env


class StepBuffers:
    """One worker's shared arrays: the actions its envs take (`actions`) and what they
    returned (`step`, an `EnvStep` whose fields are views of the same shared memory)."""

    def __init__(self, buffer, spec: EnvSpec, num_envs: int) -> None:
        places, _ = _layout(spec, num_envs)
        views = {
            name: np.ndarray(shape, dtype, buffer=buffer, offset=offset)
            for name, shape, dtype, offset in places
        }
        self.spec, self.num_envs = spec, num_envs
        self.actions: np.ndarray = views.pop("actions")
        self.step = EnvStep(**views)

    @staticmethod
    def size(spec: EnvSpec, n: int) -> int:
        """Bytes of shared memory the arrays of `n` envs of `spec` take."""
        return _layout(spec, n)[1]

    def write(self, step: EnvStep) -> None:
        """What a step of the envs returned."""
        for view, value in zip(self.step, step):  # two EnvSteps: the same fields
            view[...] = value

    def write_reset(self, obs: np.ndarray) -> None:
        """A reset: the envs' first observations, and no reward, end or episode yet."""
        for name, view in zip(EnvStep._fields, self.step, strict=True):
            view[...] = obs if name == "obs" else 0  # 0 is False in the bool fields


def _layout(spec: EnvSpec, n: int) -> tuple[list[tuple[str, tuple[int, ...], np.dtype, int]], int]:
    """Where each of `StepBuffers`' arrays stands (name, shape, dtype, byte offset, each
    aligned to `_ALIGN` bytes), and the bytes they take in all."""
    action = np.int32 if spec.discrete else np.float32
    fields = [
        ("obs", (n, *spec.obs_shape), spec.obs_dtype),
        ("actions", (n, *spec.action_shape), action),
        ("reward", (n,), np.float32),
        ("terminated", (n,), bool),
        ("truncated", (n,), bool),
        ("episode_done", (n,), bool),
        ("episode_return", (n,), np.float64),
        ("episode_length", (n,), np.int64),
    ]
    places, offset = [], 0
    for name, shape, dtype in fields:
        dtype = np.dtype(dtype)
        offset = -(-offset // _ALIGN) * _ALIGN
        places.append((name, shape, dtype, offset))
        offset += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return places, max(offset, 1)


def shared_fd(size: int) -> int:
    """A file descriptor of `size` zeroed bytes of shared memory that has no name: freed
    when the last process holding it is gone, whatever ends them."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("podrace-env-worker", 0)
    else:  # an unlinked file, in RAM where the system has /dev/shm
        where = "/dev/shm" if os.path.isdir("/dev/shm") else None
        handle, path = tempfile.mkstemp(prefix="podrace-env-worker-", dir=where)
        os.unlink(path)
        fd = handle
    os.ftruncate(fd, size)
    return fd


def read_exact(fd: int, n: int) -> bytes:
    """Exactly `n` bytes from `fd`; EOFError if it ends first."""
    parts, left = [], n
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            raise EOFError
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def error_message(error: BaseException) -> bytes:
    """An ERROR reply's message: the error's type name and its first line, pickled."""
    text = f"{type(error).__name__}: {error}".strip().splitlines()
    return pickle.dumps((type(error).__name__, text[0] if text else type(error).__name__))


__all__ = [
    "CLOSE",
    "ERROR",
    "OK",
    "RESET",
    "STEP",
    "START_TIMEOUT_S",
    "LinkBookkeeping",
    "StepBuffers",
    "WorkerSpec",
    "error_message",
    "read_exact",
    "restarted",
    "shared_fd",
]


class EnvLink(Protocol):
    """The inferring side of one env worker: a process on this host
    (`podrace.envs.workers.EnvWorker`) or a Ray actor on any node
    (`podrace.runtime.ray.served.RayEnvLink`). The inference server
    (`podrace.inference.server`) drives every link alike: it writes `buffers.actions`,
    `send`s a command, polls `fileno()` and `read_reply()`s the oldest command sent."""

    name: str
    part: range
    """Which of the actor's envs this worker steps."""
    buffers: StepBuffers
    restarts: int
    start_timeout_s: float
    """Seconds the worker may take to start and build its envs."""

    def start(self) -> None:
        """Start the worker; it builds its envs (`read_reply()` returns once it has)."""

    def wait_started(self, timeout: float | None = None) -> None:
        """Block until the worker has built its envs (its errors are `read_reply`'s)."""

    def fileno(self) -> int:
        """Readable when the oldest command sent has finished."""

    @property
    def pending(self) -> int:
        """Commands sent whose replies are not read yet."""

    def send(self, command: bytes) -> None:
        """Start `RESET` or `STEP` (after writing `buffers.actions`)."""

    def read_reply(self) -> bytes:
        """Finish the oldest command sent and return it; EnvWorkerError (the env raised),
        ConfigError (its envs cannot be built) or EnvWorkerDied (the worker is gone)."""

    def restart(self) -> None:
        """Replace a dead worker by a fresh one over the same buffers, with fresh seeds."""

    @property
    def alive(self) -> bool: ...

    def kill(self) -> None:
        """Kill the worker at once (tests, drills)."""

    def close(self) -> None:
        """End the worker and free its buffers; idempotent."""


def wait_readable(fds: list[int], timeout: float | None) -> list[int]:
    """The fds of `fds` that are readable (or closed) within `timeout` s (None: forever)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    ms = None if timeout is None else max(0, int(timeout * 1000))
    return [fd for fd, _ in poller.poll(ms)]  # retried on EINTR by Python itself (PEP 475)


START_TIMEOUT_S = 120.0
"""Seconds a worker may take to start and build its envs (imports included)."""


def restarted(spec: WorkerSpec, first_seed: int, restarts: int) -> WorkerSpec:
    """`spec` for a worker's `restarts`-th restart: its envs seeded from the first seed and
    the number of restarts (fresh episodes, reproducibly)."""
    seed = np.random.SeedSequence([first_seed, restarts]).generate_state(1)[0]
    return dataclasses.replace(spec, seed=int(seed) & 0x7FFFFFFF)


class LinkBookkeeping(ABC):
    """What every `EnvLink` keeps alike, wherever its worker runs: what the worker builds
    (reseeded at each restart), the commands sent whose replies are not read yet, the
    restart count, and the reply pipe `fileno()` returns. Subclasses start the worker,
    send commands (appending them to `_sent`), read replies and end the worker."""

    def __init__(self, name: str, worker: WorkerSpec) -> None:
        self.name, self.spec, self.part = name, worker.expect, worker.part
        self._worker_spec = worker
        self._first_seed = worker.seed
        self._sent: collections.deque[bytes] = collections.deque()
        self._reply_r = -1
        """Readable when the oldest command sent has finished (-1 while there is none)."""
        self.restarts = 0
        self.closed = False
        self.start_timeout_s = START_TIMEOUT_S

    @abstractmethod
    def start(self) -> None:
        """Start the worker; it builds its envs (`read_reply()` returns once it has)."""

    @abstractmethod
    def read_reply(self) -> bytes:
        """Finish the oldest command sent and return it (see `EnvLink.read_reply`)."""

    @abstractmethod
    def _drop_worker(self) -> None:
        """End the worker at once (it died, or is being replaced)."""

    def restart(self) -> None:
        """Replace the (dead) worker by a fresh one over the same buffers, its envs seeded
        from the first seed and the number of restarts (fresh episodes, reproducibly)."""
        self._drop_worker()
        self.restarts += 1
        self._worker_spec = restarted(self._worker_spec, self._first_seed, self.restarts)
        self.start()

    def wait_started(self, timeout: float | None = None) -> None:
        """Block until the worker has built its envs (`timeout`, default `start_timeout_s`);
        its errors are `read_reply`'s, TimeoutError after the timeout."""
        timeout = self.start_timeout_s if timeout is None else timeout
        if not wait_readable([self._reply_r], timeout):
            raise TimeoutError(f"{self.name}: its envs were not built within {timeout:g}s")
        self.read_reply()

    def fileno(self) -> int:
        """The reply pipe: readable when the oldest command sent has finished."""
        return self._reply_r

    @property
    def pending(self) -> int:
        """Commands sent whose replies are not read yet."""
        return len(self._sent)


# One actor's workers as a BatchedEnv ------------------------------------------------------


EnvLinkMaker = Callable[[str, EnvSource, EnvSpec, int, int, range, "int | None"], EnvLink]
"""(name, source, spec, num_envs, seed, part, threads) -> a link to a new env worker
stepping envs `part` of an actor's `num_envs`, seeded `seed`."""
