"""A reader blocked on a channel whose publisher goes away, for the transports' tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from podrace.sync.base import ChannelClosed, Subscriber
from tests.waiting import calling, wait_until


def wake_of_a_waiting_reader(
    sub: Subscriber, kill: Callable[[], object], join_s: float
) -> list[tuple[float, ChannelClosed]]:
    """A thread waits in `sub.get(1)` (version 1 never comes); once it waits, `kill()` takes
    the publisher away. What woke the reader within `join_s`: (seconds after the kill, the
    ChannelClosed it raised); empty if nothing did."""
    errors: list[tuple[float, ChannelClosed]] = []

    def wait_for_more() -> None:
        try:
            sub.get(1, timeout=60)
        except ChannelClosed as exc:
            errors.append((time.monotonic(), exc))

    waiter = threading.Thread(target=wait_for_more)
    waiter.start()
    wait_until(lambda: calling(waiter, "get"))  # it waits for version 1
    killed = time.monotonic()
    kill()
    waiter.join(join_s)
    return [(at - killed, exc) for at, exc in errors]
