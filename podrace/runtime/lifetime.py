"""A run's lifetime: one stop signal every blocking wait honours, and the first failure.

Every thread of a run shares one `Lifetime`. Blocking waits (queue put/get, waiting for
fresh params) register their Condition here so that `stop()` wakes them at once: no
polling, no sleeps. The first exception recorded wins; later ones are usually echoes of
the shutdown and are kept only as a count.
"""

from __future__ import annotations

import threading
from typing import Callable


class Stopped(Exception):
    """Raised inside a component when the run is stopping; not an error by itself."""


class ComponentError(RuntimeError):
    """A component (thread) of the run failed; the original exception is the __cause__."""

    def __init__(self, component: str, error: BaseException):
        super().__init__(f"{component} failed: {type(error).__name__}: {error}")
        self.component = component
        self.error = error


class Lifetime:
    def __init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self.failure: ComponentError | None = None
        self.stop_reason: str | None = None

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
