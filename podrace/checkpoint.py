"""Checkpoints: everything a stopped run needs to continue, written atomically with orbax.

`<run dir>/checkpoints/<version>/` holds two orbax items, `arrays` (train state, keys,
normalizer statistics: host copies) and `meta` (JSON: counters, next sequence numbers, the
resolved config, the env spec), plus `podrace_manifest.json` (size and SHA-256 of every
file). orbax writes a step into `<version>.orbax-checkpoint-tmp-*` and renames it only when
complete, so only integer-named directories are checkpoints and a write killed halfway
never hides or damages the previous one (tests/test_checkpoint.py kills a writer to check
this rather than trusting it). The manifest exists because orbax's array chunks carry no
checksum: a flipped byte would otherwise load as silently wrong weights.

Writing: `Checkpointer.save(state)` copies the state to the host on the caller's thread and
writes it on a background thread; after each write the oldest steps beyond `keep` are
deleted, each only under an exclusive `step_lock`, which a reader of the live run (`podrace
eval`) holds shared while it reads. Reading, verified against the manifest: `podrace.restore`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import re
import time
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import jax
import numpy as np
import orbax.checkpoint as ocp

from podrace.algos.base import TrainState
from podrace.config import ConfigError, TrainConfig
from podrace.control import ExplainedError
from podrace.metrics.registry import Metrics
from podrace.types import EnvSpec, PyTree

FORMAT = 1
MANIFEST = "podrace_manifest.json"
CHECKPOINT_DIR = "checkpoints"


@dataclass(frozen=True)
class RunState:
    """The state of a run that must survive a stop; one checkpoint holds exactly this."""

    train_state: TrainState
    """Params, optimizer state and update count (the learning-rate schedule reads it)."""
    learner_keys: Any
    """Raw uint32 learner keys, one per env: [num_actors * num_envs, 2]."""
    actor_keys: Any
    """Raw uint32 key of every actor thread: [num_actors, 2]."""
    actor_next_seq: tuple[int, ...]
    """Sequence number of the next rollout of every actor."""
    version: int
    """Params version (= learner updates applied); also the checkpoint's step."""
    env_steps: int
    episodes: int
    normalizer: PyTree | None = None
    """Observation/return normalizer statistics; None while podrace has none."""
    time_s: float = 0.0
    """Training seconds (metrics' `time_s`) when the state was taken: a resumed run's clock
    continues from here."""
    skipped_updates: int = 0
    """Updates skipped as non-finite so far (the run's skip budget spans its resumes)."""

    def arrays(self) -> dict:
        tree = {"train_state": self.train_state, "learner_keys": self.learner_keys, "actor_keys": self.actor_keys}
        if self.normalizer is not None:
            tree["normalizer"] = self.normalizer
        return tree


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def spec_json(spec: EnvSpec) -> dict:
    """The parts of an EnvSpec a network's shapes depend on, as JSON."""
    return {
        "obs_shape": list(spec.obs_shape),
        "obs_dtype": np.dtype(spec.obs_dtype).name,
        "num_actions": spec.num_actions,
        "action_shape": list(spec.action_shape),
    }


# Writing ----------------------------------------------------------------------------


class CheckpointFilesRemoved(ExplainedError, FileNotFoundError):
    """Something else deleted files of a checkpoint while the run was writing it."""


class Checkpointer:
    """Saves RunStates of one run: every `cfg.checkpoint.every_updates`, keeping the last K.

    One write at a time: `save` first waits for the previous write (and re-raises its
    error). Call save/wait/close from one thread at a time (the learner's, then the
    main thread's after the others are joined). Metrics: `checkpoint/blocked_s` (caller's time: waiting + device_get),
    `checkpoint/write_s` (background write), `checkpoint/version` (last one complete).
    """

    def __init__(self, directory: Path, cfg: TrainConfig, spec: EnvSpec, metrics: Metrics | None = None):
        self.directory = Path(directory).absolute()
        self.every_updates = cfg.checkpoint.every_updates
        self.metrics = metrics if metrics is not None else Metrics()
        self._meta = {"format": FORMAT, "config": dataclasses.asdict(cfg), "env_spec": spec_json(spec)}
        self.keep = cfg.checkpoint.keep
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None,  # rotation is ours: it spares a step a reader holds, see rotate()
            enable_async_checkpointing=False,  # our own thread writes; see save()
            cleanup_tmp_directories=True,  # leftovers of a killed write
            create=True,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="checkpoint")
        self._pending: Future | None = None
        self._last_version: int | None = None

    def due(self, version: int) -> bool:
        """True when `version` is a multiple of checkpoint.every_updates."""
        return self.every_updates > 0 and version > 0 and version % self.every_updates == 0

    def save(self, state: RunState) -> float:
        """Copy `state` to the host now, write it in the background; returns seconds blocked.

        The version this Checkpointer saved last is skipped (e.g. the final save right
        after a periodic one); any other existing version is orbax's error, never replaced.
        """
        start = time.perf_counter()
        self.wait()
        if state.version == self._last_version:
            return time.perf_counter() - start
        # An owned copy: on CPU device_get may return views of the device buffers, which a
        # learner that donates its state could reuse while the write is still reading them.
        arrays = jax.tree.map(lambda x: np.array(x, copy=True), jax.device_get(state.arrays()))
        meta = {
            **self._meta,
            "version": int(state.version),
            "env_steps": int(state.env_steps),
            "episodes": int(state.episodes),
            "time_s": float(state.time_s),
            "skipped_updates": int(state.skipped_updates),
            "actor_next_seq": [int(s) for s in state.actor_next_seq],
            "saved_at": time.time(),
        }
        self._pending = self._executor.submit(self._write, int(state.version), arrays, meta)
        self._last_version = state.version
        blocked = time.perf_counter() - start
        self.metrics.add("checkpoint/blocked_s", blocked)
        return blocked

    def _write(self, step: int, arrays: dict, meta: dict) -> None:
        start = time.perf_counter()
        args = ocp.args.Composite(arrays=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta))
        try:
            self._manager.save(step, args=args, force=True)
            self._manager.wait_until_finished()
            write_manifest(self.directory / str(step))
        except Exception as error:
            written = [self.directory / str(step), *self.directory.glob(f"{step}.orbax-checkpoint-tmp*")]
            missing = isinstance(error, FileNotFoundError) or str(error).startswith("NOT_FOUND")
            if missing or not any(path.exists() for path in written):
                # orbax's own error is a 100-line dump of a TensorStore spec
                raise CheckpointFilesRemoved(
                    f"files of checkpoint {step} in {self.directory} were deleted while it was written "
                    "(by another process?)") from error
            raise
        self.rotate()
        self.metrics.add("checkpoint/write_s", time.perf_counter() - start)
        self.metrics.set("checkpoint/version", step)

    def rotate(self) -> None:
        """Delete the oldest steps beyond checkpoint.keep, except one that a reader holds
        (`podrace eval` of this live run, see `step_lock`): it goes at a later rotation. A
        step that cannot be deleted is a warning: the new checkpoint is complete all the same."""
        for step in checkpoint_steps(self.directory)[: -self.keep]:
            step_dir = self.directory / str(step)
            with step_lock(step_dir, shared=False) as free:
                if not free:
                    continue
                try:
                    self._manager.delete(step)
                except FileNotFoundError:
                    pass  # gone already: so much the better
                except OSError as error:
                    logging.getLogger(__name__).warning("could not delete old checkpoint %s: %s", step_dir, error)

    def settle(self, timeout_s: float) -> None:
        """Wait at most `timeout_s` for the write in progress (its error is `wait`'s to raise)."""
        if self._pending is not None:
            futures.wait([self._pending], timeout_s)

    def wait(self) -> None:
        """Block until the write in progress (if any) is complete; re-raise its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Finish the write in progress, rotate once more (a step an eval held at the last
        save and has released since), then release the writer thread. A step still held
        stays until the run's next save (a resume): the end of a run does not wait for it."""
        try:
            self.wait()
            self.rotate()
        finally:
            self._executor.shutdown(wait=True)
            self._manager.close()


def write_manifest(step_dir: Path) -> None:
    """Record size and SHA-256 of every file of a complete step (atomically replaced)."""
    files = {}
    for path in sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name != MANIFEST):
        files[path.relative_to(step_dir).as_posix()] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    tmp = step_dir / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps({"format": FORMAT, "files": files}, indent=1) + "\n")
    os.replace(tmp, step_dir / MANIFEST)


READ_HOLD_WAIT_S = 10.0
"""How long a reader waits for a step a rotation holds (it is being deleted: a moment)."""


@contextlib.contextmanager
def step_lock(step_dir: Path, shared: bool) -> Iterator[bool]:
    """An flock on a step's directory: a reader holds it shared while it reads, the writer's
    rotation takes it exclusively and deletes the step only with it. Yields whether it is
    held. Exclusive: tried once (False while a reader holds the step, so it is spared).
    Shared: retried for up to READ_HOLD_WAIT_S (a rotation is deleting the step, or a fork
    child of the writer kept its descriptor), then the read goes ahead unheld; a step that
    is gone yields False. A step that cannot be opened, or a file system without flock,
    holds neither side back."""
    try:
        fd = os.open(step_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        yield False
        return
    except OSError:  # not a directory, not readable: no reader holds it (reading it fails)
        yield not shared  # the rotation tries to delete it, and warns if it cannot
        return
    try:
        held, deadline = False, time.monotonic() + READ_HOLD_WAIT_S
        while True:
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                held = True
            except BlockingIOError:
                if shared and time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
            except OSError:  # no flock on this file system: rotate as if no one reads
                held = not shared
            break
        yield held
    finally:
        os.close(fd)  # releases the lock


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# Steps on disk ----------------------------------------------------------------------


def checkpoint_steps(directory: Path) -> list[int]:
    """Steps of the complete checkpoints in `directory`, ascending (temp dirs excluded)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and re.fullmatch(r"[0-9]+", p.name))


def latest_step(directory: Path) -> int | None:
    steps = checkpoint_steps(directory)
    return steps[-1] if steps else None


def resolve_step(directory: Path, step: int | None = None) -> int:
    """`step`, or the latest one; ConfigError when there is no such checkpoint."""
    steps = checkpoint_steps(directory)
    if not steps:
        raise ConfigError(f"no checkpoint in {directory}")
    if step is None:
        return steps[-1]
    if step not in steps:
        raise ConfigError(f"no checkpoint for step {step} in {directory} (saved: {', '.join(map(str, steps))})")
    return step
