"""Hang detection: components mark when a blocking foreign call starts and ends.

A thread stuck inside `env.step` can neither raise nor be interrupted, so the run would
wait forever. Each such call is bracketed by a Heartbeat; the watchdog thread fails the
run when one has been inside a call for longer than the timeout, naming the component,
the call and the step.
"""

from __future__ import annotations

import threading
import time

from podrace.runtime.lifetime import Lifetime


class HangDetected(TimeoutError):
    """A component stayed inside one call for longer than the watchdog timeout."""


class Heartbeat:
    """Where one component is: inside `what` (since when, at which step) or idle."""

    def __init__(self, component: str):
        self.component = component
        self._what: str | None = None
        self._step = 0
        self._since = 0.0

    def enter(self, what: str, step: int) -> None:
        self._what, self._step, self._since = what, step, time.monotonic()

    def exit(self) -> None:
        self._what = None

    def overdue(self, now: float, timeout_s: float) -> str | None:
        what, since, step = self._what, self._since, self._step
        if what is not None and now - since > timeout_s:
            return f"{what} did not return within {timeout_s:g}s (step {step})"
        return None


class Watchdog:
    def __init__(self, lifetime: Lifetime, timeout_s: float):
        self.lifetime = lifetime
        self.timeout_s = timeout_s
        self.heartbeats: list[Heartbeat] = []
        self._lock = threading.Lock()

    def heartbeat(self, component: str) -> Heartbeat:
        beat = Heartbeat(component)
        with self._lock:
            self.heartbeats.append(beat)
        return beat

    def run(self) -> None:
        period = min(1.0, self.timeout_s / 4)
        while not self.lifetime.wait(period):
            now = time.monotonic()
            with self._lock:
                beats = list(self.heartbeats)
            for beat in beats:
                message = beat.overdue(now, self.timeout_s)
                if message:
                    self.lifetime.fail(beat.component, HangDetected(message))
                    return
