"""`release_later` frees what it is given on a thread of its own, which ends when asked."""

from __future__ import annotations

import threading

import pytest

from podrace.sync.versions import finish_releases, release_later


class Freed:
    def __init__(self, freed: list[int], number: int) -> None:
        self.freed, self.number = freed, number

    def __del__(self) -> None:
        self.freed.append(self.number)


def reapers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "podrace-sync-reaper"]


@pytest.mark.timeout(20)
def test_everything_released_is_freed_and_finishing_leaves_no_thread():
    freed: list[int] = []
    for number in range(3):
        release_later(Freed(freed, number))
    finish_releases()
    assert freed == [0, 1, 2] and not reapers()
    release_later(Freed(freed, 3))  # a later run's releases start the thread again
    finish_releases()
    assert freed == [0, 1, 2, 3] and not reapers()
