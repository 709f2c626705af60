"""What both sides of an env worker share (`podrace.envs.workers` drives a worker,
`podrace.envs.worker_process` is one): the one-byte commands and replies, what a worker
builds (`WorkerSpec`), and the shared-memory arrays of its envs' steps (`StepBuffers`)."""

from __future__ import annotations

import os
import pickle
import tempfile
from dataclasses import dataclass

import numpy as np

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


class StepBuffers:
    """One worker's shared arrays: observations, actions and step results of its envs."""

    def __init__(self, buffer, spec: EnvSpec, num_envs: int) -> None:
        self.spec, self.num_envs = spec, num_envs
        offset = 0
        for name, shape, dtype in self.fields(spec, num_envs):
            dtype = np.dtype(dtype)
            offset = -(-offset // _ALIGN) * _ALIGN
            size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            view = np.ndarray(shape, dtype, buffer=buffer, offset=offset)
            setattr(self, name, view)
            offset += size

    obs: np.ndarray
    actions: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    episode_done: np.ndarray
    episode_return: np.ndarray
    episode_length: np.ndarray

    @staticmethod
    def fields(spec: EnvSpec, n: int) -> list[tuple[str, tuple[int, ...], object]]:
        action = np.int32 if spec.discrete else np.float32
        return [
            ("obs", (n, *spec.obs_shape), spec.obs_dtype),
            ("actions", (n, *spec.action_shape), action),
            ("reward", (n,), np.float32),
            ("terminated", (n,), bool),
            ("truncated", (n,), bool),
            ("episode_done", (n,), bool),
            ("episode_return", (n,), np.float64),
            ("episode_length", (n,), np.int64),
        ]

    @classmethod
    def size(cls, spec: EnvSpec, n: int) -> int:
        offset = 0
        for _, shape, dtype in cls.fields(spec, n):
            offset = -(-offset // _ALIGN) * _ALIGN
            offset += int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return max(offset, 1)

    def write(self, step: EnvStep) -> None:
        self.obs[...] = step.obs
        self.reward[...] = step.reward
        self.terminated[...] = step.terminated
        self.truncated[...] = step.truncated
        self.episode_done[...] = step.episode_done
        self.episode_return[...] = step.episode_return
        self.episode_length[...] = step.episode_length


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
    "StepBuffers",
    "WorkerSpec",
    "error_message",
    "read_exact",
    "shared_fd",
]
