"""The learner process's side of the Ray workers: one thread that starts, watches, restarts
and adds workers, and receives every rollout they finish.

Every Ray call on a worker goes through here (`Collector.step`, one `ray.wait` over every
call in flight): a `start()` per incarnation being launched, and one `next()` kept waiting
on every started worker, sent again as soon as it returns, so a finished rollout leaves its
worker at once whatever the learner is doing. A worker that dies therefore takes with it
only the rollout it was making; `ray/lost_rollouts` counts finished rollouts that still
never reached this process (a reply in the object store of a node that vanished).

What happens to a rollout, and what a worker's death means for the data, is the data
order's (`Order`): the fixed order queues each worker's rollouts for its pump thread and
restarts a dead worker at the seq after the last one received; the elastic order hands them
to `podrace.runtime.ray.elastic.ElasticPipeline`, returns a dead worker's credits to the others and
restarts it in the background. A restart that Ray cannot place (its node is gone) waits in
Ray's queue until resources appear (fixed order: at most `ray.start_timeout_s`, then the
run fails; elastic: as long as it takes, the run goes on without it, and fails only when
no worker has been alive for `ray.no_workers_timeout_s`).

Every `CHECK_S` seconds the collector also looks at the cluster: it places a weight relay
on each node that can host a worker (`podrace.runtime.ray.relays`), and with
`--ray.num-workers auto` adds workers while the cluster's resources hold more.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from podrace.control import ComponentError, ExplainedError, Stopped
from podrace.runtime.ray.relays import Relays
from podrace.runtime.ray.worker import Shipment, WorkerSpec
from podrace.validation import worker_resources
from podrace.wording import times

log = logging.getLogger(__name__)

CHECK_S = 2.0
"""Seconds between looks at the cluster (relays, new nodes) and relay reports."""


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


class Order(Protocol):
    """What a data order does with workers and their rollouts (called in the collector's
    thread, or in the main thread while the run is being prepared)."""

    def started(self, slot: Slot) -> None: ...

    def received(self, slot: Slot, shipment: Shipment) -> None: ...

    def lost(self, slot: Slot) -> None: ...

    def wanted(self, slot: Slot) -> bool:
        """Whether to ask this worker for another rollout."""
        ...


class Collector:
    def __init__(
        self,
        ray: Any,
        run: Any,
        remote: Any,
        spec: Callable[[Slot], WorkerSpec],
        order: Order,
        relays: Relays | None,
        elastic: bool,
    ):
        self._ray, self.run, self._remote, self._spec = ray, run, remote, spec
        self.order = order
        self.relays = relays
        self.elastic = elastic
        self.cfg = run.cfg
        self.slots: list[Slot] = []
        self.lock = threading.Lock()
        """Guards every slot's handle and restart count against the threads that grant
        credits and kill workers."""
        self._closing = False
        self._refs: dict[Any, tuple[str, Any]] = {}
        """Calls in flight besides the workers' (relays): ref -> (kind, what)."""
        self._next_check = 0.0
        self._none_alive_since: float | None = None
        self._ever_alive = False
        """A worker has started: from then on `ray.no_workers_timeout_s` applies (before,
        the start timeout of `wait_started`)."""
        self.lost_nodes: set[str] = set()
        """Nodes a worker was lost on without an error of its own (killed, or its node
        gone) and where none has started since: left out of the room `auto` counts, as Ray
        may list a node as alive for a while after it vanished."""
        self.node = ray.get_runtime_context().get_node_id()
        """The learner's node."""
        self.direct_fetches: dict[str, set[int]] = {}
        """node -> versions workers there pulled from the learner's board themselves."""
        self.direct_out = 0
        """(node, version) pulls of those on nodes other than the learner's."""
        self.base_restart = 0
        """The restart count a worker added during the run starts at."""
        self.running = False
        """The run's loops run: a worker starting now for the first time joins it."""

    # Workers ---------------------------------------------------------------------------
    def add(self, slots: list[Slot]) -> None:
        """Launch `slots` (their start() is awaited by `step`)."""
        self.slots.extend(slots)
        for slot in slots:
            self.spawn(slot)

    def spawn(self, slot: Slot) -> None:
        """Launch `slot`'s current incarnation (its start() is awaited by `step`)."""
        cfg = self.cfg
        with self.lock:
            if self._closing:
                raise Stopped("shutdown")
            slot.handle = self._remote.options(
                num_cpus=1,
                resources=worker_resources(cfg.ray),
                max_restarts=0,
                max_concurrency=3,  # next() waits while start(), the loop and grant() run
                runtime_env={"env_vars": {"JAX_PLATFORMS": "cpu"}},
            ).remote(self._spec(slot))
            slot.start = slot.handle.start.remote()
            slot.request, slot.ready, slot.delivered = None, False, 0
        slot.launched_at = time.monotonic()

    def alive(self) -> int:
        return sum(slot.ready for slot in self.slots)

    def pending(self) -> int:
        return sum(slot.start is not None for slot in self.slots)

    def grant(self, grants: list[tuple[Any, int, int]]) -> None:
        """Send elastic credits to the workers they were granted to (any thread); an
        incarnation replaced meanwhile is skipped (its credits came back with `lose`)."""
        by_key = {}
        with self.lock:
            for slot in self.slots:
                if slot.handle is not None:
                    by_key[slot.key] = slot.handle
        for key, count, floor in grants:
            handle = by_key.get(key)
            if handle is not None:
                handle.grant.remote(count, floor)

    def kill(self) -> None:
        """Kill every worker and relay; wakes every call waiting on them. Idempotent."""
        with self.lock:
            self._closing = True
            handles = [slot.handle for slot in self.slots if slot.handle is not None]
        for handle in handles:
            with contextlib.suppress(Exception):
                self._ray.kill(handle, no_restart=True)
        if self.relays is not None:
            self.relays.kill()

    # The loop ------------------------------------------------------------------------------
    def wait_started(self, count: int) -> None:
        """Until `count` workers have started (the run's first ones: restarted within
        `ray.max_restarts` if they die starting), within `ray.start_timeout_s`."""
        deadline = time.monotonic() + self.cfg.ray.start_timeout_s
        while self.alive() < count:
            left = deadline - time.monotonic()
            if left <= 0:
                waiting = next(slot for slot in self.slots if not slot.ready)
                resources = worker_resources(self.cfg.ray)
                raise ComponentError(
                    f"ray-worker-{waiting.worker_id}",
                    TimeoutError(
                        f"not started within {self.cfg.ray.start_timeout_s:g}s (no node with a "
                        f"free CPU{' and ' + str(resources) if resources else ''}?)"
                    ),
                )
            self.run.lifetime.check()
            try:
                self.step(min(left, CHECK_S))
            except RunFails as fails:
                raise ComponentError(fails.component, fails.error) from fails.error

    def run_loop(self) -> None:
        """The collector's thread: until the run stops."""
        self.running = True
        try:
            while True:
                self.run.lifetime.check()
                self.step(None)
        except RunFails as fails:
            self.run.lifetime.fail(fails.component, fails.error)

    def step(self, timeout: float | None) -> None:
        """Wait for the next event (at most `timeout` s, or until the next check is due)
        and handle every event ready."""
        now = time.monotonic()
        due = self._housekeeping(now)
        timeout = due if timeout is None else min(timeout, due)
        calls: dict[Any, tuple[str, Any]] = dict(self._refs)
        for slot in self.slots:
            if slot.start is not None:
                calls[slot.start] = ("start", slot)
            elif slot.request is not None:
                calls[slot.request] = ("next", slot)
        if not calls:
            self.run.lifetime.wait(timeout)
            return
        ready, _ = self._ray.wait(list(calls), num_returns=1, timeout=max(timeout, 0.0))
        if ready:  # take everything ready now, not one per wait
            ready, _ = self._ray.wait(list(calls), num_returns=len(calls), timeout=0)
        for ref in ready:
            kind, what = calls[ref]
            if kind == "start":
                self._started(what)
            elif kind == "next":
                self._received(what)
            else:
                self._refs.pop(ref, None)
                self._relay_event(kind, what, ref)

    def _started(self, slot: Slot) -> None:
        ray = self._ray
        try:
            slot.node, slot.pid = ray.get(slot.start)
        except ray.exceptions.RayError as error:
            self._failed(slot, error)
            return
        slot.start, slot.ready = None, True
        self._ever_alive = True
        self.lost_nodes.discard(slot.node)
        if self.relays is not None and slot.node not in self.relays.handles:
            self._place_relay(slot.node)  # for the node's next workers (this one reads direct)
        if slot.restarts != slot.first_restart:
            log.info(
                "ray worker %d restarted on node %s (pid %d)",
                slot.worker_id,
                slot.node[:8],
                slot.pid,
            )
        elif self.running:
            self.run.metrics.count("ray/joins")
            log.info(
                "ray worker %d joined on node %s (pid %d): %d alive",
                slot.worker_id,
                slot.node[:8],
                slot.pid,
                self.alive(),
            )
        self.order.started(slot)
        if self.order.wanted(slot):
            slot.request = slot.handle.next.remote()

    def _received(self, slot: Slot) -> None:
        ray, run = self._ray, self.run
        try:
            shipment: Shipment = ray.get(slot.request)
        except ray.exceptions.RayError as error:
            self._failed(slot, error)
            return
        rollout = shipment.rollout
        if rollout.seq != slot.next_seq:
            raise RuntimeError(
                f"worker {slot.worker_id} sent seq {rollout.seq}, expected {slot.next_seq}"
            )
        slot.next_seq += 1
        slot.delivered += 1
        slot.request = slot.handle.next.remote() if self.order.wanted(slot) else None
        for record in shipment.records:
            run.metrics.add_many(record)
        run.metrics.count(f"ray/worker-{slot.worker_id}/rollouts")
        run.metrics.count(f"ray/node/{slot.node}/rollouts")
        self._count_fetches(slot.node, shipment.fetched)
        self.order.received(slot, shipment)

    def _failed(self, slot: Slot, error: BaseException) -> None:
        """Count what the dead incarnation took with it, then restart it; the run fails
        once the worker's restarts run out."""
        ray, run = self._ray, self.run
        if run.lifetime.stopping:
            raise Stopped("shutdown")
        if isinstance(error, ray.exceptions.ObjectLostError):
            run.metrics.count("ray/lost_rollouts")  # finished, but its reply was lost
        with self.lock:
            handle, slot.handle = slot.handle, None
            slot.start = slot.request = None
        was_ready, slot.ready = slot.ready, False
        with contextlib.suppress(Exception):  # already dead, or dying
            ray.kill(handle, no_restart=True)
        if was_ready:
            self.order.lost(slot)
            if not isinstance(error, ray.exceptions.RayTaskError):
                self.lost_nodes.add(slot.node)
        cause = _cause(error)
        if self.elastic:
            # A worker that dies after delivering (its node preempted) may die any number of
            # times; one whose own loop raised, or that dies before delivering, uses up its
            # restarts as in the fixed order.
            if isinstance(error, ray.exceptions.RayTaskError) or not slot.delivered:
                slot.strikes += 1
            failures = slot.strikes
        else:
            failures = slot.restarts - slot.first_restart + 1
        if failures > self.cfg.ray.max_restarts:
            crash = WorkerCrashLoop(
                f"ray worker {slot.worker_id} failed {times(failures)}, restart limit "
                f"{self.cfg.ray.max_restarts} (--ray.max-restarts); last error: "
                f"{_one_line(cause)}"
            )
            crash.__cause__ = cause
            raise RunFails(f"ray-worker-{slot.worker_id}", crash)
        counted = (
            f"restart {failures} of {self.cfg.ray.max_restarts} (--ray.max-restarts)"
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
        with self.lock:
            slot.restarts += 1
        run.metrics.count("ray/restarts")
        run.metrics.count(f"ray/worker-{slot.worker_id}/restarts")
        self.spawn(slot)

    # Looking at the cluster ------------------------------------------------------------
    def _housekeeping(self, now: float) -> float:
        """Timeouts, suspicion, the periodic look at the cluster; returns the seconds until
        the next of these is due."""
        cfg, due = self.cfg, CHECK_S
        for slot in self.slots:
            if slot.start is None or self.elastic:
                continue
            left = slot.launched_at + cfg.ray.start_timeout_s - now
            if left <= 0 and slot.first_restart != slot.restarts:
                error = WorkerNotReady(
                    f"restarted worker not ready within {cfg.ray.start_timeout_s:g}s"
                )
                raise RunFails(f"ray-worker-{slot.worker_id}", error)
            due = min(due, max(left, 0.05))
        if self.elastic and self._ever_alive:
            if self.alive():
                self._none_alive_since = None
            elif self._none_alive_since is None:
                self._none_alive_since = now
            elif now - self._none_alive_since > cfg.ray.no_workers_timeout_s:
                error = NoWorkers(
                    f"no Ray worker alive for {cfg.ray.no_workers_timeout_s:g}s "
                    f"(--ray.no-workers-timeout-s); {self.pending()} waiting for a node"
                )
                raise RunFails("ray", error)
            if self._none_alive_since is not None:
                due = min(due, self._none_alive_since + cfg.ray.no_workers_timeout_s - now)
            soon = self.order.refresh() if hasattr(self.order, "refresh") else None
            if soon is not None:
                due = min(due, soon + 0.01)
        if now >= self._next_check:
            self.look_at_cluster()
        return max(0.0, min(due, self._next_check - now))

    def look_at_cluster(self) -> None:
        """Relays on the nodes that can host workers, their reports, and (auto) more workers
        where the cluster holds more."""
        cfg = self.cfg
        self._next_check = time.monotonic() + CHECK_S
        if self.relays is None and cfg.ray.num_workers != "auto":
            return
        hosts = worker_capacity(self._ray, cfg)
        for node in self.lost_nodes:
            hosts.pop(node, None)
        if self.relays is not None:
            # As many nodes as there are workers at most, those with workers first: more
            # relays than nodes with workers would serve nobody.
            busy = {slot.node for slot in self.slots if slot.ready}
            wanted = sorted(hosts, key=lambda node: (node not in busy, node))
            for node in wanted[: max(len(self.slots), 1)]:
                self._place_relay(node)
            # One count call in flight per relay: a replaced relay's call (its node gone,
            # Ray not yet saying so) does not hold back the new relay's.
            asked = [what[1] for kind, what in self._refs.values() if kind == "relay-fetched"]
            for node, handle in list(self.relays.handles.items()):
                if not any(handle is other for other in asked):
                    self._refs[handle.fetched.remote()] = ("relay-fetched", (node, handle))
        if cfg.ray.num_workers == "auto":
            target = sum(hosts.values())
            if cfg.ray.max_workers is not None:
                target = min(target, cfg.ray.max_workers)
            first = len(self.slots)
            if target > first:
                self.add(
                    [
                        Slot(i, restarts=self.base_restart, first_restart=self.base_restart)
                        for i in range(first, target)
                    ]
                )

    def _place_relay(self, node: str) -> None:
        try:
            placed = self.relays.place(node)
        except Exception:  # noqa: BLE001 - e.g. the name of one just killed is not free yet
            return  # the next look at the cluster tries again; its workers read direct
        if placed is not None:
            stopped, handle = placed
            self._refs[stopped] = ("relay-stopped", (node, handle))

    def _relay_event(self, kind: str, what: Any, ref: Any) -> None:
        node, handle = what
        if self.relays is None:
            return
        try:
            value = self._ray.get(ref)
        except self._ray.exceptions.RayError:
            value = None
            self.relays.ended(node, handle)
        if kind == "relay-stopped":
            self.relays.ended(node, handle)
        elif value is not None:
            self.relays.counted(node, handle, value)

    def _count_fetches(self, node: str, versions: tuple[int, ...]) -> None:
        """Versions a worker on `node` pulled from the learner's board itself: each reached
        its node once (Ray moves an object to a node once)."""
        if not versions or node == self.node:
            return
        seen = self.direct_fetches.setdefault(node, set())
        for version in versions:
            if version not in seen:
                seen.add(version)
                self.direct_out += 1
        if len(seen) > 4096:
            for version in sorted(seen)[:2048]:
                seen.discard(version)

    def fetches_out(self) -> int:
        """(node, version) pulls from the learner's board by nodes other than its own."""
        relayed = self.relays.fetches_out() if self.relays is not None else 0
        return relayed + self.direct_out


def worker_capacity(ray: Any, cfg: Any) -> dict[str, int]:
    """node id -> how many workers the node holds, empty (one CPU and the worker resources
    each), for every alive node that holds at least one."""
    each = {"CPU": 1.0, **worker_resources(cfg.ray)}
    out = {}
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        have = node.get("Resources", {})
        fits = min(int(have.get(k, 0) / v + 1e-9) for k, v in each.items())
        if fits > 0:
            out[node["NodeID"]] = fits
    return out


def _cause(error: BaseException) -> BaseException:
    """The worker's own exception inside a Ray error, when Ray kept it."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".strip()


__all__ = ["Collector", "NoWorkers", "Order", "Slot", "WorkerCrashLoop", "WorkerNotReady"]
