"""Rollouts from actors to the learner: bounded per-actor queues and policy-lag accounting.

Each actor has its own bounded queue, and the learner takes one rollout from every actor
in a fixed order, so the data order of a run does not depend on thread timing. A full
queue blocks its actor on a Condition (back-pressure without polling); every blocking wait
honours the run's stop signal and is timed, so a slow stage shows up in the metrics.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import math
import threading
import time
from collections.abc import Callable, Hashable
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


class ConsumedSet:
    """The stamps (actor, restart, seq) the learner consumed in an elastic order: a set kept
    as intervals of seqs per (actor, restart), so a long run stays small. Consuming a stamp
    twice raises: "nothing consumed twice" is checked as the run goes, not only after it."""

    def __init__(self) -> None:
        self._runs: dict[tuple[int, int], list[list[int]]] = {}
        """(actor, restart) -> sorted, disjoint [first, last + 1) intervals of seqs."""
        self.count = 0

    def add(self, stamp: tuple[int, int, int]) -> None:
        actor, restart, seq = stamp
        runs = self._runs.setdefault((actor, restart), [])
        i = bisect.bisect_right(runs, [seq, math.inf])  # runs[i - 1] starts at or before seq
        if i and runs[i - 1][1] > seq:
            raise RuntimeError(f"rollout {stamp} (actor, restart, seq) was consumed twice")
        if i and runs[i - 1][1] == seq:
            runs[i - 1][1] = seq + 1
            if i < len(runs) and runs[i][0] == seq + 1:  # the gap is closed: merge
                runs[i - 1][1] = runs.pop(i)[1]
        elif i < len(runs) and runs[i][0] == seq + 1:
            runs[i][0] = seq
        else:
            runs.insert(i, [seq, seq + 1])
        self.count += 1

    def add_batch(self, stamps: list[tuple[int, int, int]]) -> None:
        for stamp in stamps:
            self.add(stamp)

    def stamps(self) -> list[tuple[int, int, int]]:
        """Every stamp, sorted by (actor, restart, seq) (not in consumption order)."""
        return [
            (actor, restart, seq)
            for (actor, restart), runs in sorted(self._runs.items())
            for first, end in runs
            for seq in range(first, end)
        ]


Grant = tuple[Hashable, int, int]
"""(worker, credits, floor): let `worker` start `credits` more rollouts, each with params of
at least version `floor`."""


@dataclasses.dataclass
class _Worker:
    """A worker (one incarnation) as the elastic pipeline sees it."""

    out: int = 0
    """Credits granted and not yet delivered: rollouts it is making or about to make."""
    since: float = 0.0
    """When it last delivered (or, having had no credit out, when it got one)."""
    interval: float | None = None
    """Typical seconds between its deliveries (exponential average)."""


class ElasticPipeline:
    """Rollouts from whichever workers deliver them; each update takes `batch` of them.

    The learner takes the first `batch` rollouts to arrive that are within the lag bound, in
    arrival order: rollout i of an update fills slot i, whichever worker made it (see the
    Ray guide's elastic order, docs/guides/ray.md, for how the learner's env columns stay
    correct). A rollout that the learner could only take over the lag bound is dropped and
    counted, never consumed.

    Credits keep the work bounded as the fixed order's sequence numbers do: a worker makes a
    rollout only with a credit (`Grant`), which names the oldest params it may act with. At
    most `batch * (max_policy_lag + 1)` credits are out at once (granted and not yet
    consumed), as many rollouts as the fixed order has in flight; a worker holds at most
    `per_worker` of those not yet delivered (one it makes, one it makes next; more while
    fewer workers are left than the limit needs). The credits an update frees by consuming
    its batch at version v are for rollouts made with params v + 1 or newer (those that
    update publishes), as the fixed order's rollout v + lag + 1 is: so, when workers keep
    pace, every rollout is consumed within the lag bound and nothing piles up.

    A worker that has not delivered for `suspect_factor` times its usual interval (its node
    vanished: Ray takes seconds to say so) no longer holds back the others: its credits stop
    counting against the limit, and whatever it delivers later is still taken if within the
    lag bound. A lost worker's credits return at once (`lose`).

    Grants are handed to `grant` (called without the lock held, in the thread whose call
    made them possible).
    """

    def __init__(
        self,
        batch: int,
        max_policy_lag: int,
        lifetime: Lifetime,
        first_version: int = 0,
        grant: Callable[[list[Grant]], None] | None = None,
        per_worker: int = 2,
        suspect_factor: float = 4.0,
        min_suspect_s: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ):
        if batch <= 0:
            raise ValueError(f"batch must be positive, got {batch}")
        self.batch = batch
        self.max_policy_lag = max_policy_lag
        self.limit = batch * (max_policy_lag + 1)
        self._per_worker = max(1, min(per_worker, max_policy_lag + 1))
        self.suspect_factor = suspect_factor
        self.min_suspect_s = min_suspect_s
        self.grant = grant
        self.consumed = ConsumedSet()
        self.dropped = 0
        """Rollouts dropped as over the lag bound."""
        self._clock = clock
        self._lifetime = lifetime
        self._cond = threading.Condition()
        lifetime.notify_on_stop(self._cond)
        self._version = first_version
        self._floor = first_version
        """The oldest params version a rollout granted now may be made with."""
        self._arrived: collections.deque[Rollout] = collections.deque()
        self._workers: dict[Hashable, _Worker] = {}
        self._held = 0
        """Credits out: granted and not yet consumed, dropped or lost (delivered included)."""
        self._longest_wait = LongestWait()

    # Workers (the runtime's side) -------------------------------------------------------
    def join(self, *workers: Hashable) -> None:
        """`workers` are ready to make rollouts: they get their credits (joined together,
        they share them evenly; one joining later gets what the others free)."""
        with self._cond:
            for worker in workers:
                if worker in self._workers:
                    raise ValueError(f"worker {worker!r} joined twice")
                self._workers[worker] = _Worker(since=self._clock())
            grants = self._grants()
        self._send(grants)

    def lose(self, worker: Hashable) -> int:
        """`worker` is gone: its credits go back; returns how many it held (rollouts it was
        making or about to make, now made by others)."""
        with self._cond:
            state = self._workers.pop(worker, None)
            if state is None:
                return 0
            self._held -= state.out
            grants = self._grants()
        self._send(grants)
        return state.out

    def deliver(self, worker: Hashable, rollout: Rollout) -> bool:
        """A rollout `worker` made with one of its credits (already placed for the learner);
        False when it was dropped as over the lag bound (it would be consumed too late)."""
        now = self._clock()
        with self._cond:
            state = self._workers.get(worker)
            if state is None or state.out <= 0:
                raise RuntimeError(f"worker {worker!r} delivered a rollout without a credit")
            state.out -= 1
            gap = now - state.since
            state.interval = gap if state.interval is None else 0.8 * state.interval + 0.2 * gap
            state.since = now
            kept = not self._stale(rollout)
            if kept:
                self._arrived.append(rollout)
                self._cond.notify_all()
            else:
                self._drop(1)
            grants = self._grants()
        self._send(grants)
        return kept

    def refresh(self) -> float | None:
        """Grant what suspicion of silent workers now allows; returns the seconds until the
        next worker would become suspect (None: none will), for the caller's next check."""
        with self._cond:
            grants = self._grants()
            now, soonest = self._clock(), None
            typical = self._typical_interval()
            for state in self._workers.values():
                after = self._suspect_after(state, typical)
                if state.out and after is not None:
                    left = state.since + after - now
                    if left > 0:
                        soonest = left if soonest is None else min(soonest, left)
        self._send(grants)
        return soonest

    @property
    def workers(self) -> int:
        with self._cond:
            return len(self._workers)

    def credits_out(self) -> int:
        with self._cond:
            return self._held

    # The learner's side -------------------------------------------------------------------
    def next_batch(self, learner_version: int) -> tuple[list[Rollout], dict[str, float]]:
        """The first `batch` rollouts to arrive within the lag bound of `learner_version`,
        in arrival order (waits for them), with lag statistics and the seconds waited."""
        start = time.perf_counter()
        with self._cond:
            self._version = self._floor = learner_version
            self._drop_stale()
            grants = self._grants()
        self._send(grants)
        with self._cond:
            while len(self._arrived) < self.batch:
                self._lifetime.check()
                self._cond.wait()
            batch = [self._arrived.popleft() for _ in range(self.batch)]
            for rollout in batch:
                lag = learner_version - rollout.policy_version
                if lag < 0:
                    raise LagExceeded(
                        f"actor {rollout.actor_id} rollout {rollout.seq} has policy version "
                        f"{rollout.policy_version}, ahead of the learner at {learner_version}"
                    )
            self.consumed.add_batch([(r.actor_id, r.restart, r.seq) for r in batch])
            self._held -= self.batch
            self._floor = learner_version + 1  # what this update will publish
            grants = self._grants()
        self._send(grants)
        waited = time.perf_counter() - start
        self._longest_wait.add(waited)
        return batch, lag_stats(batch, learner_version, waited)

    def take_longest_wait(self) -> float:
        """The longest single wait of `next_batch` for its rollouts since the last call."""
        return self._longest_wait.take()

    # Inside, with the lock held -------------------------------------------------------------
    def _stale(self, rollout: Rollout) -> bool:
        return self._version - rollout.policy_version > self.max_policy_lag

    def _drop(self, count: int) -> None:
        self.dropped += count
        self._held -= count

    def _drop_stale(self) -> None:
        kept = [r for r in self._arrived if not self._stale(r)]
        if len(kept) != len(self._arrived):
            self._drop(len(self._arrived) - len(kept))
            self._arrived = collections.deque(kept)

    @property
    def per_worker(self) -> int:
        """Credits a worker may hold undelivered: enough for the limit with the workers there
        are, and never fewer than it would hold with a full set."""
        workers = max(1, len(self._workers))
        return max(self._per_worker, -(-self.limit // workers))

    def _typical_interval(self) -> float | None:
        known = sorted(s.interval for s in self._workers.values() if s.interval is not None)
        return known[len(known) // 2] if known else None

    def _suspect_after(self, state: _Worker, typical: float | None) -> float | None:
        """Seconds of silence after which `state`'s worker is suspect (None: not yet known:
        nobody has delivered)."""
        interval = state.interval if state.interval is not None else typical
        if interval is None:
            return None
        return max(self.min_suspect_s, self.suspect_factor * interval)

    def _grants(self) -> list[Grant]:
        """Credits to grant now: to the workers holding the fewest, while the limit allows;
        the credits of workers silent for too long do not count, and they get no more."""
        now, typical = self._clock(), self._typical_interval()
        silent = set()
        for worker, state in self._workers.items():
            after = self._suspect_after(state, typical)
            if state.out and after is not None and now - state.since > after:
                silent.add(worker)
        free = self.limit - (self._held - sum(self._workers[w].out for w in silent))
        grants: dict[Hashable, int] = {}
        while free > 0:
            ready = [
                (s.out, w)
                for w, s in self._workers.items()
                if s.out < self.per_worker and w not in silent
            ]
            if not ready:
                break
            _, worker = min(ready, key=lambda pair: pair[0])
            state = self._workers[worker]
            if not state.out:
                state.since = now  # its silence counts from its first credit
            state.out += 1
            self._held += 1
            free -= 1
            grants[worker] = grants.get(worker, 0) + 1
        return [(worker, n, self._floor) for worker, n in grants.items()]

    def _send(self, grants: list[Grant]) -> None:
        if grants and self.grant is not None:
            self.grant(grants)


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
    "ConsumedSet",
    "ElasticPipeline",
    "Grant",
    "LagExceeded",
    "Pipeline",
    "PlacingSink",
    "Stopped",
]
