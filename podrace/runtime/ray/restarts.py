"""What a Ray worker's failure counts for: each worker id's slot (`Slot`: its incarnations,
restarts and strikes), the restart budget (`ray.max_restarts`) a failure is charged
against, and the errors that fail the run.

The fixed order charges every failure of a worker; the elastic order only those of a
worker whose own loop raised, or that died before delivering a rollout (a worker that
delivered and then lost its node, preempted, may die any number of times). A failure past
the budget fails the run (`RunFails`, raised in the collector's thread).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from podrace.control import ExplainedError
from podrace.wording import times

log = logging.getLogger(__name__)


class WorkerCrashLoop(ExplainedError, RuntimeError):
    """A worker failed more often than `ray.max_restarts` allows."""


class WorkerNotReady(ExplainedError, TimeoutError):
    """A restarted worker did not start within `ray.start_timeout_s` (fixed order)."""


class NoWorkers(ExplainedError, RuntimeError):
    """No worker was alive for `ray.no_workers_timeout_s` (elastic order)."""


class RunFails(Exception):
    """The run must fail: `error`, in `component` (the collector's thread records it in the
    run's lifetime; while the run is prepared it is raised as a ComponentError)."""

    def __init__(self, component: str, error: BaseException):
        super().__init__(component, error)
        self.component, self.error = component, error


@dataclass
class Slot:
    """One worker id: its current Ray actor and what this process knows about it."""

    worker_id: int
    restarts: int = 0
    """Incarnations before the current one (a resumed run starts beyond its past ones)."""
    first_restart: int = 0
    """The restart count this run started the worker with: the restart budget is per run."""
    strikes: int = 0
    """Failures counted against `ray.max_restarts`."""
    next_seq: int = 0
    """The next seq expected from this worker (a new incarnation continues there)."""
    handle: Any = None
    start: Any = None
    """The pending start() of the incarnation being launched."""
    launched_at: float = 0.0
    request: Any = None
    """The next() call waiting on the worker."""
    node: str = ""
    pid: int = 0
    ready: bool = False
    """Started, and not failed since."""
    delivered: int = 0
    """Rollouts received from the current incarnation."""

    @property
    def key(self) -> tuple[int, int]:
        """(worker id, restart): the incarnation."""
        return self.worker_id, self.restarts


def charge_failure(
    slot: Slot, error: BaseException, raised_by_worker: bool, max_restarts: int, elastic: bool
) -> None:
    """Charge `slot`'s failure (`error`; `raised_by_worker`: the worker's own loop raised)
    against `max_restarts`: RunFails once past it, else one line saying the worker is
    restarted and what it was charged."""
    cause = _cause(error)
    if elastic:
        # A worker that dies after delivering (its node preempted) may die any number of
        # times; one whose own loop raised, or that dies before delivering, uses up its
        # restarts as in the fixed order.
        if raised_by_worker or not slot.delivered:
            slot.strikes += 1
        failures = slot.strikes
    else:
        failures = slot.restarts - slot.first_restart + 1
    if failures > max_restarts:
        crash = WorkerCrashLoop(
            f"ray worker {slot.worker_id} failed {times(failures)}, restart limit "
            f"{max_restarts} (--ray.max-restarts); last error: {_one_line(cause)}"
        )
        crash.__cause__ = cause
        raise RunFails(f"ray-worker-{slot.worker_id}", crash)
    counted = (
        f"restart {failures} of {max_restarts} (--ray.max-restarts)"
        if failures
        else "not counted against --ray.max-restarts: it had delivered"
    )
    log.warning(
        "ray worker %d lost%s (%s); restarting it, %s",
        slot.worker_id,
        f" on node {slot.node[:8]}" if slot.node else "",
        _one_line(cause),
        counted,
    )


def _cause(error: BaseException) -> BaseException:
    """The worker's own exception inside a Ray error, when Ray kept it."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".strip()


__all__ = ["NoWorkers", "RunFails", "Slot", "WorkerCrashLoop", "WorkerNotReady", "charge_failure"]
