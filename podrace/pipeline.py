"""Rollouts from actors to the learner: bounded per-actor queues and policy-lag accounting.

Each actor has its own bounded queue, and the learner takes one rollout from every actor
in a fixed order, so the data order of a run does not depend on thread timing. A full
queue blocks its actor on a Condition (back-pressure without polling); every blocking wait
honours the run's stop signal and is timed, so a slow stage shows up in the metrics.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

import jax

from podrace.control import Lifetime, Stopped
from podrace.types import Rollout, Trajectory

T = TypeVar("T")


class BoundedQueue(Generic[T]):
    """FIFO with a capacity; put/get block on a Condition until possible or stopped."""

    def __init__(self, capacity: int, lifetime: Lifetime):
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self._items: collections.deque[T] = collections.deque()
        self._capacity = capacity
        self._cond = threading.Condition()
        self._lifetime = lifetime
        lifetime.notify_on_stop(self._cond)

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    def put(self, item: T) -> float:
        """Append `item`, waiting while full; returns the seconds spent waiting."""
        start = time.perf_counter()
        with self._cond:
            while len(self._items) >= self._capacity:
                self._lifetime.check()
                self._cond.wait()
            self._lifetime.check()
            self._items.append(item)
            self._cond.notify_all()
        return time.perf_counter() - start

    def get(self) -> tuple[T, float]:
        """Pop the oldest item, waiting while empty; returns (item, seconds waited)."""
        start = time.perf_counter()
        with self._cond:
            while not self._items:
                self._lifetime.check()
                self._cond.wait()
            item = self._items.popleft()
            self._cond.notify_all()
        return item, time.perf_counter() - start

    def try_put(self, item: T) -> bool:
        """Append without waiting; False (item dropped) when full."""
        with self._cond:
            if len(self._items) >= self._capacity:
                return False
            self._items.append(item)
            self._cond.notify_all()
            return True


class LagExceeded(RuntimeError):
    """A rollout older than the lag bound reached the learner (an actor broke the contract)."""


class ConsumedLog:
    """The stamp (actor, restart, seq) of every rollout the learner consumed, in order.

    Kept as blocks of batches that repeat: a batch whose actors and restarts are the
    previous batch's, each seq one further, extends the block. So a long run's log stays
    a few entries (one per restart), and "nothing consumed twice" stays checkable."""

    def __init__(self) -> None:
        self._blocks: list[tuple[tuple[tuple[int, int, int], ...], list[int]]] = []
        """(the block's first batch of stamps, [batches in the block])."""

    def add_batch(self, stamps: list[tuple[int, int, int]]) -> None:
        if self._blocks:
            first, count = self._blocks[-1]
            if len(first) == len(stamps) and all(
                (a, r, s + count[0]) == stamp for (a, r, s), stamp in zip(first, stamps)
            ):
                count[0] += 1
                return
        self._blocks.append((tuple(stamps), [1]))

    def stamps(self) -> list[tuple[int, int, int]]:
        """Every stamp, in consumption order."""
        return [
            (a, r, s + k)
            for first, (count,) in self._blocks
            for k in range(count)
            for a, r, s in first
        ]


class Pipeline:
    """One queue per actor; `next_batch` returns one rollout per actor, in actor order."""

    def __init__(
        self,
        num_actors: int,
        capacity: int,
        max_policy_lag: int,
        lifetime: Lifetime,
        first_seq: int = 0,
    ):
        self.queues = [BoundedQueue[Rollout](capacity, lifetime) for _ in range(num_actors)]
        self.consumed = ConsumedLog()
        self.max_policy_lag = max_policy_lag
        self._expected_seq = [first_seq] * num_actors
        self._longest_wait = LongestWait()

    def put(self, rollout: Rollout) -> float:
        return self.queues[rollout.actor_id].put(rollout)

    def next_batch(self, learner_version: int) -> tuple[list[Rollout], dict[str, float]]:
        """Rollouts for the update that starts from params `learner_version`.

        Returns them with lag statistics and the total seconds waited. A rollout out of
        sequence or over the lag bound is a broken contract and raises.
        """
        batch, waited = [], 0.0
        for actor_id, queue in enumerate(self.queues):
            rollout, seconds = queue.get()
            waited += seconds
            if rollout.seq != self._expected_seq[actor_id]:
                raise RuntimeError(
                    f"actor {actor_id} sent rollout {rollout.seq}, "
                    f"expected {self._expected_seq[actor_id]}"
                )
            self._expected_seq[actor_id] += 1
            lag = learner_version - rollout.policy_version
            if lag > self.max_policy_lag or lag < 0:
                raise LagExceeded(
                    f"actor {actor_id} rollout {rollout.seq} has policy version "
                    f"{rollout.policy_version}, learner is at {learner_version} "
                    f"(lag {lag}, bound {self.max_policy_lag})"
                )
            batch.append(rollout)
        self.consumed.add_batch([(r.actor_id, r.restart, r.seq) for r in batch])
        self._longest_wait.add(waited)
        return batch, lag_stats(batch, learner_version, waited)

    def take_longest_wait(self) -> float:
        """The longest single wait of `next_batch` for its rollouts since the last call."""
        return self._longest_wait.take()


def lag_stats(batch: list[Rollout], learner_version: int, waited: float) -> dict[str, float]:
    lags = [learner_version - r.policy_version for r in batch]
    return {
        "lag_min": float(min(lags)),
        "lag_mean": sum(lags) / len(lags),
        "lag_max": float(max(lags)),
        "queue_get_wait": waited,
    }


class LongestWait:
    """The longest of the waits added since the last `take` (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._longest = 0.0

    def add(self, seconds: float) -> None:
        with self._lock:
            self._longest = max(self._longest, seconds)

    def take(self) -> float:
        with self._lock:
            longest, self._longest = self._longest, 0.0
        return longest


class PlacingSink:
    """The in-process RolloutSink: places each rollout on the learner mesh, then queues it.

    Placement runs in the actor's thread (off the learner's critical path) and is timed as
    `to_learner` in the rollout's timings; `put` returns the seconds waited on the queue.
    """

    def __init__(self, pipeline: Pipeline, place: Callable[[Trajectory], Trajectory]):
        self.pipeline = pipeline
        self.place = place

    def put(self, rollout: Rollout) -> float:
        start = time.perf_counter()
        placed = self.place(rollout.trajectory)
        jax.block_until_ready(placed)
        rollout.timings["to_learner"] = time.perf_counter() - start
        return self.pipeline.put(dataclasses.replace(rollout, trajectory=placed))


__all__ = [
    "BoundedQueue",
    "ConsumedLog",
    "LagExceeded",
    "Pipeline",
    "PlacingSink",
    "Stopped",
]
