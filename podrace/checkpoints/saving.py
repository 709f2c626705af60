"""Saving a run's state: every N updates, at the end, and when stopped.

The learner thread records a `RunState` after every update (references to the arrays it
just published, no copy) and saves it when `checkpoint.every_updates` says so; the save
copies to the host and writes on the Checkpointer's own thread. The final save, after the
learner thread has returned, writes the last *recorded* state rather than the learner's
attributes: a learner stopped between its update and its publish holds params one update
ahead of its version, and saving those would break "params version = updates applied".
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from pathlib import Path

from podrace.checkpoints.files import ONE_PROCESS, Checkpointer, Writers
from podrace.checkpoints.state import RunState, checkpoint_dir
from podrace.config import TrainConfig
from podrace.control import Lifetime, Stopped
from podrace.metrics.registry import Metrics
from podrace.sync.versions import release_later
from podrace.types import EnvSpec

log = logging.getLogger(__name__)

FAILED_RUN_WRITE_WAIT_S = 10.0
"""How long a failed multi-process run waits for a checkpoint write in progress."""


class RunCheckpoints:
    """The checkpoints of one run; `start` is the state it begins from (fresh or restored),
    `env_factory` what they record of the run's env factory (see `Checkpointer`).

    States at or before `start.version` are never saved again (they are the checkpoint a
    resumed run came from, or a fresh run's untrained params). Call `record`/`save_final`/
    `close` as the Checkpointer requires: from one thread at a time.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        spec: EnvSpec,
        run_dir: Path,
        metrics: Metrics,
        start: RunState,
        writers: Writers = ONE_PROCESS,
        env_factory: dict | None = None,
    ):
        self._cfg, self._spec, self._run_dir, self._metrics = cfg, spec, Path(run_dir), metrics
        self._writers = writers
        self._env_factory = env_factory
        self._checkpointer: Checkpointer | None = None
        self._first_version = start.version
        self.point = start
        """The latest consistent state: what a save now would write."""
        self.previous: RunState | None = None
        """The state recorded before `point`, kept where several processes save together
        (their newest recorded versions may differ by one: they save the older)."""
        self._pending_version: int | None = None
        self._lock = threading.Lock()
        self._save_lock = threading.Lock()

    def open(self) -> None:
        """Create the writer (and the checkpoints folder; leftovers of a killed write go);
        nothing where the writers cannot write (see `Writers.enabled`)."""
        if self._writers.enabled:
            self._checkpointer = Checkpointer(
                checkpoint_dir(self._run_dir),
                self._cfg,
                self._spec,
                self._metrics,
                self._writers,
                self._env_factory,
            )

    @property
    def latest(self) -> int | None:
        """Version of the run's latest complete checkpoint: the last written by this run,
        else the one it resumed from (`Run` names it in the metrics at the start)."""
        version = self._metrics.last("checkpoint/version")
        return None if version is None else int(version)

    @property
    def writing(self) -> int | None:
        """Version of a save still being written, if any (for a process about to exit)."""
        with self._lock:
            pending = self._pending_version
        return None if pending is None or pending == self.latest else pending

    def record(self, point: RunState, lifetime: Lifetime) -> None:
        """Learner thread, after each update: remember `point`; save it when due.

        A save that fails fails the run as component `checkpoint`. The point it replaces
        holds the last references to the state before: it is freed off the learner thread."""
        if self._writers.num_processes > 1:
            released, self.previous, self.point = self.previous, self.point, point
        else:
            released, self.point = self.point, point
        release_later(released)
        if self._checkpointer is not None and self._checkpointer.due(point.version):
            try:
                self._save(point)
            except Exception as error:  # noqa: BLE001 - becomes the run's failure
                lifetime.fail("checkpoint", error)
                raise Stopped("checkpoint failed") from error

    def save_final(
        self, lifetime: Lifetime, version: int, actor_restarts: tuple[int, ...] | None = None
    ) -> None:
        """Start saving the recorded state of `version` (unless already saved, or the run's
        start); `close` waits for it. `actor_restarts`, the actors' restart counts now,
        replace the recorded ones: an actor restarted since that update is an incarnation
        a resumed run must start beyond."""
        if self._checkpointer is None or version <= self._first_version:
            return
        kept = [p for p in (self.point, self.previous) if p is not None and p.version == version]
        if not kept:
            log.warning("no last checkpoint: version %d is no longer held", version)
            return
        point = kept[0]
        if actor_restarts is not None:
            point = dataclasses.replace(point, actor_restarts=tuple(actor_restarts))
        self._guarded(lifetime, self._save, point)

    def _save(self, point: RunState) -> None:
        with self._save_lock:  # the learner thread's last save may meet the main thread's
            with self._lock:
                self._pending_version = point.version
            checkpointer = self._checkpointer
            if checkpointer is not None:
                checkpointer.save(point)

    def settle(self, timeout_s: float) -> None:
        """Give the write in progress up to `timeout_s` to finish (its outcome is `close`'s)."""
        if self._checkpointer is not None:
            self._checkpointer.settle(timeout_s)

    def abandon(self) -> None:
        """Leave a write in progress behind (it waits for a process that was lost)."""
        if self._checkpointer is not None:
            checkpointer, self._checkpointer = self._checkpointer, None
            checkpointer.abandon()

    def close(self, lifetime: Lifetime) -> None:
        """Finish the write in progress and release the writer.

        A failure is the run's failure as component `checkpoint`, unless the run already
        failed (then it is a note of that failure: the first failure is the one to report,
        and the CLI reports both on its one line). After a failure, a write that several
        processes make together is waited for at most FAILED_RUN_WRITE_WAIT_S: it may wait
        for a process that is gone."""
        if self._checkpointer is not None:
            checkpointer, self._checkpointer = self._checkpointer, None
            if lifetime.failure is not None and self._writers.num_processes > 1:
                checkpointer.settle(FAILED_RUN_WRITE_WAIT_S)
                if checkpointer.writing:
                    log.warning("checkpoint %s not written: the run failed", self._pending_version)
                    checkpointer.abandon()
                    return
            self._guarded(lifetime, checkpointer.close)

    @staticmethod
    def _guarded(lifetime: Lifetime, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as error:  # noqa: BLE001 - becomes the run's failure
            if lifetime.failure is None:
                lifetime.fail("checkpoint", error)
            else:  # often the same cause (a full disk): told with the failure, not apart
                lifetime.failure.add_note(str(error))


__all__ = ["RunCheckpoints"]
