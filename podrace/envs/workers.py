"""Env worker processes: each steps a part of one actor's envs, in a process of its own, and
exchanges observations and actions with whoever infers over shared memory.

A Python env (Gymnasium's classic control, Box2D, MuJoCo through Gymnasium, a user's own
env) stepped in an actor thread holds the interpreter lock: every actor thread of a run
then shares one core. A worker process steps its envs on a core of its own.

One worker = one process + one shared-memory block + two pipes:

- the block (a memfd, or an unlinked file where there is none: nothing to leak, whatever
  kills the processes) holds the part's observations, actions, rewards, flags and episode
  statistics as NumPy arrays both sides map (`StepBuffers`);
- the command pipe carries one byte per command (reset, step, close); the reply pipe one
  byte per finished command, or an error message. A pipe is also how a death is seen: the
  reply pipe ends (EOF) when the process is gone, however it died.

Whoever infers writes the actions into the block, sends `step`, and later (when the reply
pipe is readable: `fileno()` for `poll`) reads the reply and the results in the block. The
inference server (`podrace.inference`) drives many workers at once this way; `WorkerEnv`
drives the workers of one actor in lockstep, as a BatchedEnv.

Why not Gymnasium's `AsyncVectorEnv`: it runs one process per env and sends every step's
actions and every step's results through a pipe per env (pickled), observations alone
through shared memory; here one process steps a part of the envs (a `SyncVectorEnv` or
any backend) and one byte crosses a pipe per step. Measured on the 2-core machine
(`benchmarks/env_workers.py`, CartPole with random actions, `benchmarks/results/
env_workers.json`): 2 workers step 29.4k / 49.9k / 78.4k env steps/s for 8 / 16 / 64
envs, AsyncVectorEnv (shared memory) 11.7k / 11.7k / 12.4k: 2.5-6.3x slower, so podrace
uses its own processes.

The worker ignores SIGINT (a Ctrl-C reaches the whole process group; the run decides how to
stop) and exits when its command pipe closes (the parent exited or was killed) or, on
Linux, when the parent process dies (PR_SET_PDEATHSIG).

This module is the parent's side (`EnvWorker`, `WorkerEnv`); the process itself is
`podrace.envs.worker_process`, and what both share (commands, replies, `WorkerSpec`,
`StepBuffers`) is `podrace.envs.worker_protocol`; the env factory reaches the process
pickled by `podrace.envs.sending`.
"""

from __future__ import annotations

import logging
import mmap
import os
import pickle
import signal
import struct
import subprocess
import sys

import numpy as np

from podrace.config import ConfigError
from podrace.control import ExplainedError
from podrace.envs.sending import pickled
from podrace.envs.source import EnvSource
from podrace.envs.worker_protocol import (
    CLOSE,
    OK,
    RESET,
    STEP,
    LinkBookkeeping,
    StepBuffers,
    WorkerSpec,
    read_exact,
    shared_fd,
    wait_readable,
)
from podrace.types import EnvSpec, EnvStep

CLOSE_GRACE_S = 2.0
"""Seconds a worker gets to close its envs and exit before it is killed."""


log = logging.getLogger(__name__)


class EnvWorkerError(ExplainedError, RuntimeError):
    """An env in a worker raised; the message names the worker, the command and the error."""


class EnvWorkerDied(ExplainedError, RuntimeError):
    """A worker process ended without being asked to (killed, crashed)."""


def split_envs(num_envs: int, workers: int) -> list[range]:
    """The envs each of `workers` workers steps: consecutive, equal parts."""
    if workers <= 0 or num_envs % workers:
        raise ConfigError(
            f"env.num_envs ({num_envs}) must be a multiple of env.workers ({workers}): "
            "each env worker steps an equal part of an actor's envs"
        )
    size = num_envs // workers
    return [range(i * size, (i + 1) * size) for i in range(workers)]


def _died(returncode: int | None) -> str:
    if returncode is None:
        return "closed its reply pipe"
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


class EnvWorker(LinkBookkeeping):
    """The parent's side of one env worker process (see the module docstring): an `EnvLink`.

    `start()` spawns the process, which builds its envs; `send(RESET)` / `send(STEP)` (after
    writing `buffers.actions`) start a command, `read_reply()` finishes the oldest one sent
    (blocking until it is done; `fileno()` is readable when it is). `restart()` replaces
    a dead process by a fresh one over the same buffers, with fresh seeds.
    """

    def __init__(
        self,
        name: str,
        source: EnvSource,
        spec: EnvSpec,
        num_envs: int,
        seed: int,
        part: range,
        threads: int | None = None,
    ) -> None:
        super().__init__(name, WorkerSpec(source, num_envs, seed, part, threads, spec))
        size = StepBuffers.size(spec, len(part))
        self._shm_fd = shared_fd(size)
        self._map = mmap.mmap(self._shm_fd, size)
        self.buffers = StepBuffers(self._map, spec, len(part))
        self.process: subprocess.Popen | None = None
        self._cmd_w = -1

    # Starting ------------------------------------------------------------------------
    def start(self) -> None:
        """Spawn the process; it builds its envs (`read_reply()` returns once it has)."""
        payload = pickled(self._worker_spec)
        cmd_r, cmd_w = os.pipe()
        reply_r, reply_w = os.pipe()
        env = dict(os.environ)
        path = [os.path.abspath(p) for p in sys.path if p]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
        try:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "from podrace.envs.worker_process import worker_main; worker_main()",
                    str(cmd_r),
                    str(reply_w),
                    str(self._shm_fd),
                ],
                pass_fds=(cmd_r, reply_w, self._shm_fd),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        finally:
            os.close(cmd_r)
            os.close(reply_w)
        self._cmd_w, self._reply_r = cmd_w, reply_r
        self._sent.clear()
        self._sent.append(b"start")
        try:
            os.write(cmd_w, struct.pack("<I", len(payload)) + payload)
        except OSError:
            pass  # the process died at once: its reply pipe says so

    # Commands --------------------------------------------------------------------------
    def send(self, command: bytes) -> None:
        self._sent.append(command)
        try:
            os.write(self._cmd_w, command)
        except OSError:
            pass  # a dead process: `read_reply` reports it

    def read_reply(self) -> bytes:
        """Finish the oldest command sent and return it; raises EnvWorkerError (the env
        raised: one line), ConfigError (its envs cannot be built) or EnvWorkerDied."""
        command = self._sent.popleft() if self._sent else b"?"
        try:
            reply = read_exact(self._reply_r, 1)
            if reply == OK:
                return command
            (length,) = struct.unpack("<I", read_exact(self._reply_r, 4))
            kind, message = pickle.loads(read_exact(self._reply_r, length))
        except (EOFError, OSError):
            raise EnvWorkerDied(self.death()) from None
        what = {b"start": "building its envs", RESET: "env.reset", STEP: "env.step"}
        if kind == "ConfigError":
            raise ConfigError(message.removeprefix("ConfigError: "))
        raise EnvWorkerError(f"{self.name}: {what.get(command, 'a command')} raised {message}")

    def death(self) -> str:
        """One line: which worker ended, and how."""
        returncode = None
        if self.process is not None:
            try:
                returncode = self.process.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                returncode = None
        pid = self.process.pid if self.process is not None else "?"
        return f"env worker {self.name} (pid {pid}) {_died(returncode)}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the process (tests, drills)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()

    # Closing --------------------------------------------------------------------------
    def _drop_worker(self) -> None:
        self._end_process(kill=True)

    def _end_process(self, kill: bool, grace: float = CLOSE_GRACE_S) -> None:
        process = self.process
        if process is not None:
            if not kill:
                try:
                    os.write(self._cmd_w, CLOSE)
                except OSError:
                    pass  # its pipe is gone: the process is dead or dying, reaped below
                try:
                    process.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    pass  # killed below
            if process.poll() is None:
                process.kill()
                try:
                    process.wait(timeout=grace)
                except subprocess.TimeoutExpired:  # in the kernel's hands: say so, go on
                    log.warning(
                        "%s: pid %d not gone %gs after SIGKILL", self.name, process.pid, grace
                    )
        for fd in (self._cmd_w, self._reply_r):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass  # already closed: nothing is left to release
        self._cmd_w = self._reply_r = -1
        self._sent.clear()

    def close(self, grace: float = CLOSE_GRACE_S) -> None:
        """Ask the worker to close its envs and exit; kill it after `grace` s. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self._end_process(kill=False, grace=grace)
        try:
            self._map.close()
        except BufferError:
            pass  # views still held: the mapping goes with them
        os.close(self._shm_fd)


class WorkerEnv:
    """`num_envs` envs stepped by `workers` worker processes in lockstep: a BatchedEnv.

    Each step writes every part's actions, starts every worker, then waits for all of
    them (they step at the same time). A worker that dies or raises fails the step with
    one line naming it."""

    def __init__(
        self,
        source: EnvSource,
        spec: EnvSpec,
        num_envs: int,
        seed: int,
        workers: int,
        threads: int | None = None,
        name: str = "env",
    ) -> None:
        self.spec, self.num_envs = spec, num_envs
        self.workers = [
            EnvWorker(f"{name}.w{i}", source, spec, num_envs, seed, part, threads)
            for i, part in enumerate(split_envs(num_envs, workers))
        ]
        try:
            for worker in self.workers:
                worker.start()
            for worker in self.workers:
                worker.wait_started()
        except BaseException:
            self.close()
            raise

    def _all(self, command: bytes) -> None:
        for worker in self.workers:
            worker.send(command)
        for worker in self.workers:
            worker.read_reply()

    def reset(self) -> np.ndarray:
        self._all(RESET)
        return np.concatenate([w.buffers.step.obs for w in self.workers])

    def step(self, actions: np.ndarray) -> EnvStep:
        actions = np.asarray(actions)
        for worker in self.workers:
            worker.buffers.actions[...] = actions[worker.part.start : worker.part.stop]
        self._all(STEP)
        parts = zip(*(w.buffers.step for w in self.workers), strict=True)
        return EnvStep(*(np.concatenate(field) for field in parts))

    def close(self) -> None:
        for worker in self.workers:
            worker.close()


__all__ = [
    "EnvWorker",
    "EnvWorkerDied",
    "EnvWorkerError",
    "WorkerEnv",
    "split_envs",
    "wait_readable",
]
