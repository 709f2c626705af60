"""Control primitives every loop may import: the run's lifetime, heartbeats, the watchdog.

A `Lifetime` is one stop signal that every blocking wait honours, plus the first failure.
Blocking waits (queue put/get, waiting for fresh params) register their Condition here so
that `stop()` wakes them at once: no polling, no sleeps. The first exception recorded wins;
later ones are usually echoes of the shutdown.

A thread stuck inside a foreign call (`env.step`, `env.reset`) can neither raise nor be
interrupted. Such calls are bracketed by a `Heartbeat`; the `Watchdog` fails the run when
one has been inside a call for longer than its timeout, naming the component, the call
and the step.

`Control` is what a loop receives: a stop check, its heartbeat and a way to record
metrics. It holds nothing a remote worker could not have its own copy of.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass


class ExplainedError(Exception):
    """A failure whose one-line message is the whole story: the CLI prints it without a
    traceback (a base to add beside the exception's own)."""


class Stopped(Exception):
    """Raised inside a component when the run is stopping; not an error by itself."""


class ComponentError(RuntimeError):
    """A component (thread) of the run failed; the original exception is the __cause__."""

    def __init__(self, component: str, error: BaseException):
        super().__init__(f"{component} failed: {type(error).__name__}: {error}")
        self.component = component
        self.error = error


def raise_stopped_if_stopping(lifetime: Lifetime, error: BaseException) -> None:
    """While preparing a run: an error caused by a stop (a signal closed the publisher under
    the learner's first publish) is the stop, not a failure; raise Stopped for it."""
    if (
        lifetime.stopping
        and lifetime.failure is None
        and isinstance(error, Exception)
        and not isinstance(error, Stopped)
    ):
        raise Stopped(lifetime.stop_reason) from error


class HangDetected(ExplainedError, TimeoutError):
    """A component stayed inside one call for longer than the watchdog timeout."""


class Lifetime:
    def __init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self.failure: ComponentError | None = None
        self.stop_reason: str | None = None
        self.run_dir = None
        """The run directory once a prepare created it, so that a caller that abandons a
        preparation stuck in native code (the CLI after its grace period) can remove it."""

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def on_stop(self, callback: Callable[[], None]) -> None:
        """Call `callback` once when the run stops (immediately if it already has)."""
        with self._lock:
            if not self._stop.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def notify_on_stop(self, condition: threading.Condition) -> None:
        """Wake every waiter of `condition` when the run stops."""

        def wake() -> None:
            with condition:
                condition.notify_all()

        self.on_stop(wake)

    def stop(self, reason: str = "stopped") -> None:
        with self._lock:
            if self._stop.is_set():
                return
            self.stop_reason = reason
            self._stop.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def fail(self, component: str, error: BaseException) -> None:
        """Record the first failure and stop the run."""
        with self._lock:
            if self.failure is None:
                failure = ComponentError(component, error)
                failure.__cause__ = error
                self.failure = failure
        self.stop(f"{component} failed")

    def check(self) -> None:
        """Raise Stopped if the run is stopping (for loops between blocking calls)."""
        if self._stop.is_set():
            raise Stopped(self.stop_reason)

    def wait(self, timeout: float | None = None) -> bool:
        return self._stop.wait(timeout)


class Heartbeat:
    """Where one component is: inside `what` (since when, at which step) or idle."""

    def __init__(self, component: str):
        self.component = component
        self._what: str | None = None
        self._step = 0
        self._since = 0.0
        self._steps = 1

    def enter(self, what: str, step: int, steps: int = 1) -> None:
        """Inside `what` from now; `steps` env steps run inside it (a fused rollout runs a
        whole rollout in one call), each allowed the watchdog's timeout."""
        self._what, self._step, self._since, self._steps = (
            what,
            step,
            time.monotonic(),
            max(int(steps), 1),
        )

    def exit(self) -> None:
        self._what = None

    def overdue(self, now: float, timeout_s: float) -> str | None:
        what, since, step, steps = self._what, self._since, self._step, self._steps
        limit = timeout_s * steps
        if what is not None and now - since > limit:
            return f"{what} did not return within {limit:g}s (step {step})"
        return None


class Watchdog:
    """Fails the run when any heartbeat stays inside one call for more than `timeout_s`."""

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
        # A fine period: a hang reaches the caller within the timeout plus a fraction of a second.
        period = min(0.25, self.timeout_s / 4)
        while not self.lifetime.wait(period):
            now = time.monotonic()
            with self._lock:
                beats = list(self.heartbeats)
            for beat in beats:
                message = beat.overdue(now, self.timeout_s)
                if message:
                    self.lifetime.fail(beat.component, HangDetected(message))
                    return


@dataclass(frozen=True)
class Control:
    """What a loop may do besides its work: see the stop, mark foreign calls, record metrics."""

    lifetime: Lifetime
    heartbeat: Heartbeat
    record: Callable[[Mapping[str, float]], None]

    def check(self) -> None:
        """Raise Stopped if the run is stopping."""
        self.lifetime.check()

    def call(self, what: str, step: int, fn: Callable, *args, steps: int = 1):
        """`fn(*args)` watched by the heartbeat, after checking for a stop (one env call;
        `steps` env steps inside it, each allowed the watchdog's timeout)."""
        self.lifetime.check()
        self.heartbeat.enter(what, step, steps)
        try:
            return fn(*args)
        finally:
            self.heartbeat.exit()
