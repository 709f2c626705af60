"""A pytest plugin that records each test's wall time and CPU time, to find where the
suite's CPU goes (its wall time on 2 cores is bounded below by its CPU seconds / 2).

    PODRACE_TEST_CPU_LOG=/tmp/cpu.jsonl python -m pytest -q -n 3 -p tests.cpu_record

Each test process appends one JSON line per test to that file: the test id, the xdist
worker, its start (epoch seconds), wall seconds, and the CPU seconds (user + system) of the
test process itself and of the child processes it waited for during the test
(subprocesses; a local Ray's daemons only where they were reaped). Summed per module (the
id up to `::`), `self` + `children` show where the suite's CPU seconds go.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator

import pytest

LOG = "PODRACE_TEST_CPU_LOG"


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get(LOG):
        raise pytest.UsageError(f"-p tests.cpu_record writes to the file named by ${LOG}: set it")


def _cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    start, wall = time.time(), time.monotonic()
    own, children = _cpu_s(resource.RUSAGE_SELF), _cpu_s(resource.RUSAGE_CHILDREN)
    yield
    line = {
        "id": item.nodeid,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "start": start,
        "wall": time.monotonic() - wall,
        "self": _cpu_s(resource.RUSAGE_SELF) - own,
        "children": _cpu_s(resource.RUSAGE_CHILDREN) - children,
    }
    # One write of one line in append mode: the lines of several test processes never mix.
    with open(os.environ[LOG], "a") as log:
        log.write(json.dumps(line) + "\n")
