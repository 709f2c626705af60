"""Polling for a condition that another thread or process makes true, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    predicate: Callable[[], bool],
    timeout: float = 10.0,
    describe: Callable[[], object] | None = None,
) -> None:
    """Return once `predicate()` is true; fail the test (showing `describe()`) after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, (
            describe() if describe else "condition not reached in time"
        )
        time.sleep(0.005)
