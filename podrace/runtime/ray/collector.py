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
from typing import Any, Protocol

from podrace.control import ComponentError, Stopped
from podrace.runtime.ray.cluster import worker_capacity
from podrace.runtime.ray.relays import DirectFetches, Relays
from podrace.runtime.ray.restarts import (
    NoWorkers,
    RunFails,
    Slot,
    WorkerNotReady,
    charge_failure,
)
from podrace.runtime.ray.worker import Shipment, WorkerSpec
from podrace.validation import worker_resources

log = logging.getLogger(__name__)

CHECK_S = 2.0
"""Seconds between looks at the cluster (relays, new nodes) and relay reports."""


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
        self.direct = DirectFetches(self.node)
        """Versions workers pulled from the learner's board themselves."""
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
                self.relays.answered(kind, *what, ref)

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
        self.direct.add(slot.node, shipment.fetched)
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
        raised = isinstance(error, ray.exceptions.RayTaskError)
        charge_failure(slot, error, raised, self.cfg.ray.max_restarts, self.elastic)
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
        hosts = worker_capacity(self._ray, cfg.ray)
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

    def fetches_out(self) -> int:
        """(node, version) pulls from the learner's board by nodes other than its own."""
        relayed = self.relays.fetches_out() if self.relays is not None else 0
        return relayed + self.direct.out


__all__ = ["Collector", "Order"]
