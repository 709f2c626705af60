"""The elastic data order's pipeline (`--runtime ray --ray.data-order elastic`): each update
takes the first rollouts to arrive from any Ray workers, within the lag bound, and credits
bound what each worker makes (`ElasticPipeline`); `ConsumedSet` checks that nothing is
consumed twice as the run goes. The fixed order uses the per-actor `podrace.pipeline`."""

from __future__ import annotations

import bisect
import collections
import dataclasses
import math
import threading
import time
from collections.abc import Callable, Hashable

from podrace.control import Lifetime
from podrace.pipeline import LagExceeded, LongestWait, lag_stats
from podrace.types import Rollout


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


__all__ = ["ConsumedSet", "ElasticPipeline", "Grant"]
