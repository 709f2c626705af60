"""Checkpoints: everything a stopped run needs to continue, written atomically with orbax.

`<run dir>/checkpoints/<version>/` holds two orbax items, `arrays` (train state, keys,
normalizer statistics: host copies) and `meta` (JSON: counters, next sequence numbers, the
resolved config, the env spec, the env factory of a run given one), plus
`podrace_manifest.json` (size and SHA-256 of every file). A step is written whole under
another name (`<version>.partial`: orbax's items, then the manifest) and renamed to
`<version>` only then, so an integer-named directory is a
complete checkpoint with its manifest, and a write killed at any moment never hides or
damages the previous one (tests/checkpoints/test_files.py kills a writer to check this rather than
trusting it); the next writer of the run clears what a killed write or deletion left. The
manifest exists because orbax's array chunks carry no checksum: a flipped byte would
otherwise load as silently wrong weights.

Writing: `Checkpointer.save(state)` copies the state to the host on the caller's thread and
writes it on a background thread; after each write the oldest steps beyond `keep` are
deleted, each only under an exclusive `step_lock`, which a reader of the live run (`podrace
eval`) holds shared while it reads. Reading, verified against the manifest:
`podrace.checkpoints.read`. The folder's step names and a reader's hold on a step:
`podrace.checkpoints.steps`; the manifest: `podrace.checkpoints.manifest`.

Several processes (a multi-host run, `Writers`) write one checkpoint together with orbax's
multi-process save: every process calls `save` with the same version, orbax writes each
process's shards of the global arrays and meets the others at barriers of the coordination
service (never device collectives, which would run into the learner's); process 0 alone
clears leftovers, writes the manifest, renames the step and rotates.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp

from podrace.checkpoints.manifest import sync_directory, write_manifest
from podrace.checkpoints.orbax_loops import draining_loops
from podrace.checkpoints.state import RunState, spec_json
from podrace.checkpoints.steps import (
    DELETING,
    FORMAT,
    PARTIAL,
    checkpoint_steps,
    leftovers,
    step_lock,
)
from podrace.config import TrainConfig
from podrace.control import ExplainedError
from podrace.metrics.registry import Metrics
from podrace.types import EnvSpec

# Writing ----------------------------------------------------------------------------


class CheckpointFilesRemoved(ExplainedError, FileNotFoundError):
    """Something else deleted files of a checkpoint while the run was writing it."""


class CheckpointWriteFailed(ExplainedError, OSError):
    """The storage refused a checkpoint's files (a full disk, permissions, an I/O error)."""


def storage_error_text(error: BaseException, directory: Path) -> str:
    """orbax/TensorStore's message on one line: without the spec dump it appends, paths
    relative to `directory`, and its end (the system's reason) kept when it is long."""
    text = " ".join(str(error).split()).split("[tensorstore_spec")[0].strip()
    text = text.replace(f"{directory}{os.sep}", "")
    return text if len(text) <= 500 else f"{text[:150]} ... {text[-300:]}"


def _is_refusal(error: BaseException) -> bool:
    """The storage refused to write: permissions or a read-only file system (an OSError, or
    TensorStore's "PERMISSION_DENIED: ..." status)."""
    if isinstance(error, OSError):
        return error.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
    return str(error).startswith("PERMISSION_DENIED") or "Read-only file system" in str(error)


def _is_storage_error(error: BaseException) -> bool:
    """OSError, or orbax/TensorStore's status error ("RESOURCE_EXHAUSTED: ...")."""
    return isinstance(error, OSError) or re.match(r"[A-Z][A-Z_]+: ", str(error)) is not None


@dataclass(frozen=True)
class Writers:
    """The processes that write a run's checkpoints together, and whether they can."""

    process_id: int = 0
    num_processes: int = 1
    enabled: bool = True
    """False where not every process sees the run directory (no checkpoints then)."""
    share_counters: Callable[[int, dict], list[dict] | None] | None = field(
        default=None, compare=False
    )
    """How every process's counters of a save reach process 0, which writes the meta:
    called by each process with (version, its counters), it returns every process's in
    process order on process 0 and None elsewhere. None: one process."""

    def every_process(self, version: int, counters: dict) -> list[dict] | None:
        """The counters of every process for the save of `version` (process 0; None on the
        others, which only hand theirs over)."""
        if self.share_counters is None:
            return [counters]
        return self.share_counters(version, counters)

    @property
    def primary(self) -> bool:
        """This process owns the files (manifest, rename, rotation)."""
        return self.process_id == 0

    def orbax_options(self, barrier: str) -> ocp.options.MultiprocessingOptions | None:
        """orbax's options for one save or restore whose barriers are named `barrier`
        (a name each process uses once); None for a single process."""
        if self.num_processes == 1:
            return None
        return ocp.options.MultiprocessingOptions(
            primary_host=0,
            active_processes=set(range(self.num_processes)),
            barrier_sync_key_prefix=barrier,
        )


ONE_PROCESS = Writers()
"""A run whose checkpoints one process writes."""


class Checkpointer:
    """Saves RunStates of one run: every `cfg.checkpoint.every_updates`, keeping the last K.

    One write at a time: `save` first waits for the previous write (and re-raises its
    error). Call save/wait/close from one thread at a time (the learner's, then the
    main thread's after the others are joined). Metrics: `checkpoint/blocked_s` (caller's
    time: waiting + device_get), `checkpoint/write_s` (background write),
    `checkpoint/version` (last one complete).
    """

    def __init__(
        self,
        directory: Path,
        cfg: TrainConfig,
        spec: EnvSpec,
        metrics: Metrics | None = None,
        writers: Writers = ONE_PROCESS,
        env_factory: dict | None = None,
    ):
        """`env_factory`: `podrace.envs.source.factory_record` of the run's env factory (None:
        its envs come from `cfg.env.id`), kept in the meta so that a resume or an eval builds
        the same envs."""
        self.directory = Path(directory).absolute()
        self.writers = writers
        self.every_updates = cfg.checkpoint.every_updates
        self.metrics = metrics if metrics is not None else Metrics()
        self._meta = {
            "format": FORMAT,
            "config": dataclasses.asdict(cfg),
            "env_spec": spec_json(spec),
        }
        if env_factory is not None:
            self._meta["env_factory"] = env_factory
        self.keep = cfg.checkpoint.keep
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="checkpoint")
        self._pending: Future | None = None
        self._last_version: int | None = None
        self.directory.mkdir(parents=True, exist_ok=True)
        if writers.primary:
            for leftover in leftovers(self.directory):  # the run lock is ours: no other writer
                shutil.rmtree(leftover, ignore_errors=True)
        self._quiet = _QuietAbout(self.directory)
        logging.getLogger("absl").addFilter(self._quiet)

    def due(self, version: int) -> bool:
        """True when `version` is a multiple of checkpoint.every_updates."""
        return self.every_updates > 0 and version > 0 and version % self.every_updates == 0

    def save(self, state: RunState) -> float:
        """Copy `state` to the host now, write it in the background; returns seconds blocked.

        The version this Checkpointer saved last is skipped (e.g. the final save right
        after a periodic one); any other existing version is an error, never replaced.
        """
        start = time.perf_counter()
        self.wait()
        if state.version == self._last_version:
            return time.perf_counter() - start
        if self.writers.num_processes == 1:
            # An owned copy: on CPU device_get may return views of the device buffers, which
            # a learner that donated its state could reuse while the write still reads them.
            arrays = jax.tree.map(lambda x: np.array(x, copy=True), jax.device_get(state.arrays()))
        else:  # global arrays: orbax copies each process's shards (the learner never donates)
            arrays = state.arrays()
        meta = {
            **self._meta,
            "version": int(state.version),
            "env_steps": int(state.env_steps),
            "episodes": int(state.episodes),
            "time_s": float(state.time_s),
            "skipped_updates": int(state.skipped_updates),
            "actor_next_seq": [int(s) for s in state.actor_next_seq],
            "actor_restarts": [int(r) for r in state.actor_restarts],
            "saved_at": time.time(),
        }
        counters = {name: float(value) for name, value in state.counters.items()}
        self._pending = self._executor.submit(
            self._write, int(state.version), arrays, meta, counters
        )
        self._last_version = state.version
        blocked = time.perf_counter() - start
        self.metrics.add("checkpoint/blocked_s", blocked)
        return blocked

    def _write(self, step: int, arrays: dict, meta: dict, counters: dict) -> None:
        start = time.perf_counter()
        primary = self.writers.primary
        final, partial = self.directory / str(step), self.directory / f"{step}{PARTIAL}"
        every = self.writers.every_process(step, counters)
        if every is not None:
            meta = {**meta, "counters": every}  # one entry per process, in process order
        args = ocp.args.Composite(
            arrays=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta)
        )
        try:
            if not self.directory.parent.is_dir():  # made again, it would hold only this step
                raise CheckpointFilesRemoved(
                    f"checkpoint {step} cannot be written: the run directory "
                    f"{self.directory.parent} was deleted"
                )
            self.directory.mkdir(exist_ok=True)  # deleted since the last save: made again
            if final.exists():
                raise FileExistsError(
                    f"checkpoint {step} already exists in {self.directory}; it is never replaced"
                )
            if primary:
                shutil.rmtree(partial, ignore_errors=True)
            orbax = orbax_checkpointer(self.writers, f"podrace-save-{step}")
            try:
                # A failed write's other writes finish before orbax closes its loop.
                with draining_loops():
                    orbax.save(partial, args=args)
            finally:
                orbax.close()
            if primary:
                write_manifest(partial)
                os.rename(partial, final)  # files and manifest appear together, or not at all
                sync_directory(self.directory)
        except (FileExistsError, CheckpointFilesRemoved):
            raise
        except Exception as error:
            unfinished = [partial, *self.directory.glob(f"{step}{PARTIAL}.orbax-checkpoint-tmp*")]
            missing = isinstance(error, FileNotFoundError) or str(error).startswith("NOT_FOUND")
            # A folder that refuses writes (read-only, permissions) gets nothing: not a deletion.
            refused = _is_refusal(error)
            if missing or not (refused or any(path.exists() for path in [final, *unfinished])):
                # orbax's own error is a 100-line dump of a TensorStore spec
                raise CheckpointFilesRemoved(
                    f"files of checkpoint {step} in {self.directory} were deleted while it was "
                    "written (by another process?)"
                ) from error
            if primary:
                for path in unfinished:  # give the space back (a full disk)
                    shutil.rmtree(path, ignore_errors=True)
            # A folder made read-only during the write keeps what was written before: named,
            # as `leftovers` lets the run's next writer (a resume) remove it.
            kept = [str(path) for path in unfinished if os.path.lexists(path)]
            left = (
                f"; {', '.join(kept)} could not be removed (it is never read as a checkpoint; "
                "the run's next writer removes it)"
                if kept and primary
                else ""
            )
            if _is_storage_error(error):
                raise CheckpointWriteFailed(
                    f"checkpoint {step} could not be written in {self.directory}: "
                    f"{storage_error_text(error, self.directory)}{left}"
                ) from error
            raise
        self.metrics.add("checkpoint/write_s", time.perf_counter() - start)
        self.metrics.set("checkpoint/version", step)  # complete: whatever happens to the rotation
        if primary:
            self.rotate()

    def rotate(self) -> None:
        """Delete the oldest steps beyond checkpoint.keep, except one that a reader holds
        (`podrace eval` of this live run, see `step_lock`): it goes at a later rotation. A
        step leaves the listing at once (renamed, then deleted), so a deletion killed
        halfway leaves no damaged checkpoint. A step that cannot be deleted is a warning:
        the new checkpoint is complete all the same."""
        for step in checkpoint_steps(self.directory)[: -self.keep]:
            step_dir = self.directory / str(step)
            with step_lock(step_dir, shared=False) as free:
                if not free:
                    continue
                try:
                    if step_dir.is_symlink():
                        raise OSError(f"{step_dir} is a symbolic link, not a step this run wrote")
                    doomed = self.directory / f"{step}{DELETING}"
                    os.rename(step_dir, doomed)
                    shutil.rmtree(doomed)
                except FileNotFoundError:
                    pass  # gone already: so much the better
                except OSError as error:
                    logging.getLogger(__name__).warning(
                        "could not delete old checkpoint %s: %s", step_dir, error
                    )

    @property
    def writing(self) -> bool:
        """A write is in progress."""
        return self._pending is not None and not self._pending.done()

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
            if self.writers.primary:
                self.rotate()
        finally:
            self._executor.shutdown(wait=True)
            logging.getLogger("absl").removeFilter(self._quiet)

    def abandon(self) -> None:
        """Leave the write in progress behind (a process of the run was lost: its barriers
        would wait for it); the next writer of the run clears what it leaves."""
        self._pending = None
        self._executor.shutdown(wait=False)
        logging.getLogger("absl").removeFilter(self._quiet)


class _QuietAbout(logging.Filter):
    """Drops orbax's log records about files under one directory: its threads log a write's
    failure with a traceback (and TensorStore's spec dump) that the Checkpointer's own
    one-line error replaces."""

    def __init__(self, directory: Path):
        super().__init__()
        self._directory = str(directory)

    def filter(self, record: logging.LogRecord) -> bool:
        return self._directory not in record.getMessage()


def orbax_checkpointer(
    writers: Writers = ONE_PROCESS, barrier: str = "podrace"
) -> ocp.Checkpointer:
    """orbax's writer and reader of one step directory: the `arrays` and `meta` items; for
    several processes, with barriers named `barrier` (see `Writers.orbax_options`)."""
    options = writers.orbax_options(barrier)
    if options is None:
        handlers = {
            "arrays": ocp.StandardCheckpointHandler(),
            "meta": ocp.JsonCheckpointHandler(),
        }
        return ocp.Checkpointer(ocp.CompositeCheckpointHandler(**handlers))
    handlers = {
        "arrays": ocp.StandardCheckpointHandler(multiprocessing_options=options),
        "meta": ocp.JsonCheckpointHandler(multiprocessing_options=options),
    }
    composite = ocp.CompositeCheckpointHandler(
        composite_options=ocp.CompositeOptions(multiprocessing_options=options),
        **handlers,
    )
    return ocp.Checkpointer(composite, multiprocessing_options=options)
