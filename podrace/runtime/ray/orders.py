"""The Ray workers' two data orders (`--ray.data-order`), as the collector
(`podrace.runtime.ray.collector`) hands them each worker's rollouts; see
`podrace.runtime.ray.workers`."""

from __future__ import annotations

import collections
import dataclasses
import threading
import time

import jax

from podrace.actor import RolloutSink
from podrace.runtime.fleet import FleetContext
from podrace.runtime.ray.elastic import ElasticPipeline
from podrace.runtime.ray.restarts import Slot
from podrace.runtime.ray.worker import Shipment
from podrace.types import Rollout


class FixedOrder:
    """Update k takes rollout k of every worker: each worker's rollouts wait in its inbox
    until its pump thread places them and queues them for the learner, in seq order."""

    def __init__(self, ctx: FleetContext, sink: RolloutSink):
        self.run, self.sink = ctx, sink
        self.last = ctx.cfg.num_updates
        self.inboxes: dict[int, collections.deque[Rollout]] = {}
        self._cond = threading.Condition()
        ctx.lifetime.notify_on_stop(self._cond)

    def started(self, slot: Slot) -> None:
        pass

    def wanted(self, slot: Slot) -> bool:
        return slot.next_seq < self.last

    def received(self, slot: Slot, shipment: Shipment) -> None:
        with self._cond:
            self.inboxes.setdefault(slot.worker_id, collections.deque()).append(shipment.rollout)
            self._cond.notify_all()

    def lost(self, slot: Slot) -> None:
        pass

    def pump(self, worker_id: int, first: int) -> None:
        """Place worker `worker_id`'s rollouts `first`.. on the learner mesh and queue them."""
        run, sink = self.run, self.sink
        for _ in range(first, self.last):
            with self._cond:
                inbox = self.inboxes.setdefault(worker_id, collections.deque())
                while not inbox:
                    run.lifetime.check()
                    self._cond.wait()
                rollout = inbox.popleft()
            sink.put(rollout)  # placed on the learner mesh, then queued (may wait)
            run.metrics.add("actor/to_learner", rollout.timings["to_learner"])


class ElasticOrder:
    """Rollouts go to the elastic pipeline as they arrive, placed by the collector."""

    def __init__(self, ctx: FleetContext):
        self.run = ctx
        self.pipeline: ElasticPipeline = ctx.pipeline

    def started(self, slot: Slot) -> None:
        self.pipeline.join(slot.key)

    def wanted(self, slot: Slot) -> bool:
        return True

    def received(self, slot: Slot, shipment: Shipment) -> None:
        run = self.run
        rollout = shipment.rollout
        start = time.perf_counter()
        placed = run.placement.place(jax.device_put(rollout.trajectory, run.devices.learners[0]))
        jax.block_until_ready(placed)
        rollout.timings["to_learner"] = time.perf_counter() - start
        run.metrics.add("actor/to_learner", rollout.timings["to_learner"])
        if not self.pipeline.deliver(slot.key, dataclasses.replace(rollout, trajectory=placed)):
            run.metrics.count("ray/dropped_rollouts")

    def lost(self, slot: Slot) -> None:
        self.run.metrics.count("ray/lost_credits", self.pipeline.lose(slot.key))

    def refresh(self) -> float | None:
        return self.pipeline.refresh()


__all__ = ["ElasticOrder", "FixedOrder"]
