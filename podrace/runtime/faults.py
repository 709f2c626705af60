"""Fault injection for tests and drills, applied where a run is built (no special build).

    run = prepare(cfg, faults=FaultPlan(env_hang=(0, 50)))
    run.run()   # fails within the watchdog timeout, naming actor-0 and the step

Each fault goes through the interfaces a real one would: a raising or hanging env is a
wrapped env, a failing actor has a params subscriber that raises, a NaN loss comes from
NaN rewards in the batch, a slow stage really sleeps.
"""

from __future__ import annotations

import errno
import threading
import time
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp

from podrace.control import Lifetime, Stopped
from podrace.sync.base import Snapshot, Subscriber

STUCK = threading.Event()
"""What a non-cooperative hang blocks on. Nothing in a run sets it; a test may set it to
free the threads it left behind (then clear it)."""


class InjectedFault(RuntimeError):
    """An error raised on purpose by a FaultPlan."""


@dataclass(frozen=True)
class FaultPlan:
    env_raise: tuple[int, int] | None = None
    """(actor id, env step): that actor's env.step raises at that step (1-based)."""
    env_hang: tuple[int, int] | None = None
    """(actor id, env step): that actor's env.step never returns (until the run stops)."""
    env_stuck: tuple[int, int] | None = None
    """(actor id, env step): that actor's env.step blocks and ignores the stop, like a call
    stuck in native code (the thread is left behind; see `STUCK`)."""
    reset_hang: str | None = None
    """`actor-N` or `evaluator`: that component's first env.reset never returns (until the
    run stops)."""
    nan_at_update: int | None = None
    """Learner update (1-based) whose batch gets NaN rewards, so its loss is NaN."""
    actor_raise: tuple[int, int] | None = None
    """(actor id, rollout seq): the actor raises before that rollout (its params source fails)."""
    evaluator_raise: bool = False
    """The evaluator's env raises on its first step (first evaluation)."""
    slow: dict[str, float] = field(default_factory=dict)
    """Extra seconds per call of a stage: `env_step`, `learner_step`."""
    sink_raise_at: int | None = None
    """A metrics sink raises ENOSPC on its n-th line (1-based), as on a full disk."""


@dataclass
class FaultyEnv:
    """Wraps a BatchedEnv: raise, hang (cooperatively or not) or slow down at given calls."""

    env: object
    lifetime: Lifetime
    raise_at: int | None = None
    hang_at: int | None = None
    stuck_at: int | None = None
    hang_reset: bool = False
    delay_s: float = 0.0
    steps: int = 0
    stuck_since: float | None = None
    """time.monotonic() when the non-cooperative hang began."""
    closed: bool = False

    def close(self) -> None:
        self.closed = True
        self.env.close()

    def __getattr__(self, name):
        return getattr(self.env, name)

    def reset(self):
        if self.hang_reset:
            self.hang_reset = False
            self._hang()
        return self.env.reset()

    def step(self, actions):
        self.steps += 1
        if self.steps == self.raise_at:
            raise InjectedFault(f"injected env error at step {self.steps}")
        if self.steps == self.hang_at:
            self._hang()
        if self.steps == self.stuck_at:
            self.stuck_since = time.monotonic()
            STUCK.wait()  # ignores the run's stop, as a call into native code would
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.env.step(actions)

    def _hang(self) -> None:
        self.lifetime.wait()  # "hung" until the run is stopped (so it can be joined)
        raise Stopped("hung env released by shutdown")


class FailingSubscriber(Subscriber):
    """A params source whose n-th request (one per rollout) raises."""

    def __init__(self, inner: Subscriber, fail_at_call: int):
        self.inner, self.fail_at_call, self.calls = inner, fail_at_call, 0

    def _count(self) -> None:
        self.calls += 1
        if self.calls == self.fail_at_call:
            raise InjectedFault(f"injected actor error before rollout {self.calls - 1}")

    def poll(self) -> Snapshot | None:
        self._count()
        return self.inner.poll()

    def get(self, min_version: int, timeout: float | None = None) -> Snapshot:
        self._count()
        return self.inner.get(min_version, timeout)

    @property
    def acked_version(self) -> int | None:
        return self.inner.acked_version

    def close(self) -> None:
        self.inner.close()


class FullDiskSink:
    """A metrics sink that fails with ENOSPC from its n-th line on."""

    def __init__(self, fail_at_line: int):
        self.fail_at_line, self.lines = fail_at_line, 0

    def write(self, line: dict[str, float]) -> None:
        self.lines += 1
        if self.lines >= self.fail_at_line:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")

    def close(self) -> None:
        pass


class Faults:
    """A FaultPlan applied where a run's pieces are built (`podrace.runtime.run`): every
    fault goes through the interface a real one would."""

    def __init__(self, plan: FaultPlan, lifetime: Lifetime):
        self.plan, self.lifetime = plan, lifetime

    def env(self, owner: str, env):
        """`owner`'s env (`actor-N` or `evaluator`), faulty where the plan says so."""
        plan = self.plan

        def mine(fault: tuple[int, int] | None) -> int | None:
            return fault[1] if fault and f"actor-{fault[0]}" == owner else None

        faulty = FaultyEnv(
            env,
            self.lifetime,
            raise_at=1 if plan.evaluator_raise and owner == "evaluator" else mine(plan.env_raise),
            hang_at=mine(plan.env_hang),
            stuck_at=mine(plan.env_stuck),
            hang_reset=plan.reset_hang == owner,
            delay_s=plan.slow.get("env_step", 0.0) if owner != "evaluator" else 0.0,
        )
        active = (
            faulty.raise_at or faulty.hang_at or faulty.stuck_at or faulty.hang_reset
        ) or faulty.delay_s
        return faulty if active else env

    def params(self, owner: str, subscriber: Subscriber) -> Subscriber:
        """`owner`'s params source; one that raises before the planned rollout."""
        fault = self.plan.actor_raise
        if fault and owner == f"actor-{fault[0]}":
            # The actor asks for params exactly once per rollout, starting at rollout 0.
            return FailingSubscriber(subscriber, fault[1] + 1)
        return subscriber

    def sinks(self) -> list:
        """Metrics sinks to add after the configured ones."""
        at = self.plan.sink_raise_at
        return [] if at is None else [FullDiskSink(at)]

    def update(self, update_fn):
        """The learner's update: NaN rewards at the planned update, or slower."""
        nan_at, delay_s = self.plan.nan_at_update, self.plan.slow.get("learner_step", 0.0)
        if nan_at is None and not delay_s:
            return update_fn
        calls = [0]
        poison = jax.jit(lambda rewards: rewards * jnp.nan)  # jitted: no host-to-device copy

        def update(state, trajs, keys):
            calls[0] += 1
            if calls[0] == nan_at:
                trajs = tuple(t._replace(rewards=poison(t.rewards)) for t in trajs)
            if delay_s:
                time.sleep(delay_s)
            return update_fn(state, trajs, keys)

        update.__wrapped__ = update_fn  # the jitted step (for lowering)
        return update
