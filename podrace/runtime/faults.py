"""Fault injection for tests and drills, applied to a prepared run (no special build).

    run = prepare(cfg)
    inject(run, FaultPlan(env_hang=(0, 50)))
    run.run()   # fails within the watchdog timeout, naming actor-0 and the step

Each fault goes through the same code paths as a real one: a raising or hanging env is
a wrapped env, a NaN loss comes from NaN rewards in the batch, a slow stage really sleeps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp

from podrace.runtime.lifetime import Lifetime, Stopped


class InjectedFault(RuntimeError):
    """An error raised on purpose by a FaultPlan."""


@dataclass(frozen=True)
class FaultPlan:
    env_raise: tuple[int, int] | None = None
    """(actor id, env step): that actor's env.step raises at that step (1-based)."""
    env_hang: tuple[int, int] | None = None
    """(actor id, env step): that actor's env.step never returns (until the run stops)."""
    nan_at_update: int | None = None
    """Learner update (1-based) whose batch gets NaN rewards, so its loss is NaN."""
    actor_raise: tuple[int, int] | None = None
    """(actor id, rollout seq): the actor thread raises before that rollout."""
    evaluator_raise: bool = False
    """The evaluator's env raises on its first step (first evaluation)."""
    slow: dict[str, float] = field(default_factory=dict)
    """Extra seconds per call of a stage: `env_step`, `learner_step`."""


class FaultyEnv:
    """Wraps a BatchedEnv: raise, hang or slow down at given steps."""

    def __init__(self, env, lifetime: Lifetime, raise_at=None, hang_at=None, delay_s: float = 0.0):
        self.env, self.lifetime = env, lifetime
        self.raise_at, self.hang_at, self.delay_s = raise_at, hang_at, delay_s
        self.steps = 0

    def __getattr__(self, name):
        return getattr(self.env, name)

    def step(self, actions):
        self.steps += 1
        if self.steps == self.raise_at:
            raise InjectedFault(f"injected env error at step {self.steps}")
        if self.steps == self.hang_at:
            self.lifetime.wait()  # "hung" until the run is stopped (so it can be joined)
            raise Stopped("hung env released by shutdown")
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.env.step(actions)


def inject(run, plan: FaultPlan) -> None:
    """Apply `plan` to a prepared SingleHostRun (before `run.run()`)."""
    for actor in run.actors:
        raise_at = plan.env_raise[1] if plan.env_raise and plan.env_raise[0] == actor.actor_id else None
        hang_at = plan.env_hang[1] if plan.env_hang and plan.env_hang[0] == actor.actor_id else None
        delay = plan.slow.get("env_step", 0.0)
        if raise_at or hang_at or delay:
            actor.env = FaultyEnv(actor.env, run.lifetime, raise_at, hang_at, delay)
        if plan.actor_raise and plan.actor_raise[0] == actor.actor_id:
            _raise_before_rollout(actor, plan.actor_raise[1])
    if plan.evaluator_raise:
        run.evaluator.env = FaultyEnv(run.evaluator.env, run.lifetime, raise_at=1)
    if plan.nan_at_update is not None or "learner_step" in plan.slow:
        _wrap_update(run.learner, plan.nan_at_update, plan.slow.get("learner_step", 0.0))


def _raise_before_rollout(actor, seq: int) -> None:
    refresh = actor._refresh_params

    def failing_refresh(s: int) -> None:
        if s == seq:
            raise InjectedFault(f"injected actor error before rollout {s}")
        refresh(s)

    actor._refresh_params = failing_refresh


def _wrap_update(learner, nan_at: int | None, delay_s: float) -> None:
    update_fn = learner.update_fn
    calls = [0]
    poison = jax.jit(lambda rewards: rewards * jnp.nan)  # jitted: no host-to-device transfer

    def update(state, trajs, keys):
        calls[0] += 1
        if calls[0] == nan_at:
            trajs = tuple(t._replace(rewards=poison(t.rewards)) for t in trajs)
        if delay_s:
            time.sleep(delay_s)
        return update_fn(state, trajs, keys)

    learner.update_fn = update
