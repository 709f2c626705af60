"""An env worker process: builds its part of an actor's envs, then steps them on command
(see `podrace.envs.workers` for the whole design and the parent's side)."""

from __future__ import annotations

import ctypes
import mmap
import os
import pickle
import signal
import struct
import sys

import numpy as np

from podrace.envs.closing import close_envs
from podrace.envs.worker_protocol import (
    CLOSE,
    ERROR,
    OK,
    RESET,
    STEP,
    StepBuffers,
    WorkerSpec,
    error_message,
    read_exact,
)


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies (a parent killed with SIGKILL never
    closes anything; the command pipe's EOF would only be seen between env calls)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # then the command pipe's EOF ends it, between env calls


def worker_main() -> None:
    """Entry point of a worker process: argv = command fd, reply fd, shared-memory fd."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    cmd_fd, reply_fd, shm_fd = (int(a) for a in sys.argv[1:4])
    if os.getppid() == 1:  # the parent died before PR_SET_PDEATHSIG took effect
        return

    def reply_error(error: BaseException) -> None:
        message = error_message(error)
        os.write(reply_fd, ERROR + struct.pack("<I", len(message)) + message)

    env = None
    try:
        (length,) = struct.unpack("<I", read_exact(cmd_fd, 4))
        message = read_exact(cmd_fd, length)
    except EOFError:
        return
    try:
        spec: WorkerSpec = pickle.loads(message)
        env = spec.build()
        size = StepBuffers.size(spec.expect, len(spec.part))
        buffers = StepBuffers(mmap.mmap(shm_fd, size), spec.expect, len(spec.part))
    except BaseException as error:  # noqa: BLE001 - reported to the parent, which decides
        reply_error(error)
        return
    os.write(reply_fd, OK)
    try:
        while True:
            try:
                command = os.read(cmd_fd, 1)
            except OSError:
                return
            if command in (b"", CLOSE):
                return
            try:
                if command == RESET:
                    buffers.write_reset(env.reset())
                elif command == STEP:
                    buffers.write(env.step(np.array(buffers.actions)))
                else:
                    raise RuntimeError(f"unknown command {command!r}")
            except Exception as error:  # noqa: BLE001 - reported to the parent, which fails the run
                reply_error(error)
                continue
            os.write(reply_fd, OK)
    finally:
        if env is not None:  # a close that raises is a warning on stderr, as in an actor thread
            close_envs([(f"env worker (pid {os.getpid()})", env)])


__all__ = ["worker_main"]
