"""The threads alive when the current test started (recorded by an autouse fixture in
tests/conftest.py): a thread an earlier test in the same process left behind on purpose
(stuck in native code) is not the current test's leak."""

from __future__ import annotations

import threading

at_start: set[threading.Thread] = set()


def record() -> None:
    at_start.clear()
    at_start.update(threading.enumerate())


def started_since(*prefixes: str) -> list[threading.Thread]:
    """Threads alive now, started since the test began, whose names start with `prefixes`."""
    return [t for t in threading.enumerate() if t not in at_start and t.name.startswith(prefixes)]


def podrace_threads() -> list[threading.Thread]:
    """The run threads (actors, learner, evaluator) this test started that are still alive."""
    return started_since("actor-", "learner", "evaluator")
