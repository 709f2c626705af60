"""Named threads under one Lifetime: the first failure stops all, every thread is joined.

The main thread stays free to log and to receive Ctrl-C. Threads are daemons only so that a
thread stuck in foreign code (a hung env) cannot keep the process alive after we report it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import jax

from podrace.control import Lifetime, Stopped
from podrace.sync.base import ChannelClosed


class ThreadGroup:
    def __init__(self, lifetime: Lifetime):
        self.lifetime = lifetime
        self.threads: list[threading.Thread] = []

    def spawn(self, name: str, fn: Callable[[], None], guard_transfers: bool = True) -> None:
        """Run `fn` in a thread; its exception fails the whole run, naming `name`."""

        def target() -> None:
            try:
                if guard_transfers:
                    # Config contexts are thread-local: the guard must be entered here.
                    with jax.transfer_guard("disallow"):
                        fn()
                else:
                    fn()
            except Stopped:
                return  # the run is stopping; whoever stopped it recorded why
            except ChannelClosed:
                if not self.lifetime.stopping:
                    self.lifetime.fail(name, ChannelClosed("weights channel closed"))
            except BaseException as error:  # noqa: BLE001 - re-raised in the main thread
                self.lifetime.fail(name, error)

        thread = threading.Thread(target=target, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def join(self, timeout: float) -> list[str]:
        """Join every thread within `timeout` seconds in total; return the names still alive."""
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in self.threads if t.is_alive()]


__all__ = ["ThreadGroup"]
