"""Named threads under one Lifetime: the first failure stops all, every thread is joined.

The main thread stays free to log and to receive Ctrl-C. Threads are daemons only so that a
thread stuck in foreign code (a hung env) cannot keep the process alive after we report it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

import jax

from podrace.control import Lifetime, Stopped
from podrace.sync.base import ChannelClosed

ENV_CLOSE_GRACE_S = 10.0
"""Seconds all of a run's `env.close()` calls get together; a close still running after
that is left behind (an env subprocess that ignores its shutdown)."""

log = logging.getLogger(__name__)


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


def close_envs(envs: Iterable[tuple[str, object]], timeout: float | None = None) -> list[str]:
    """Close each `(owner, env)` in a daemon thread, all within `timeout` seconds
    (default `ENV_CLOSE_GRACE_S`).

    Closing is user code that runs after the run's results are settled: an exception is
    logged as a warning naming its owner (the run's checkpoint, metrics and exit status stand),
    and a close that blocks does not keep the process: its "<owner> env.close" is returned,
    like a stuck thread's name.
    """

    def close(owner: str, env) -> None:
        try:
            env.close()
        except Exception as error:  # noqa: BLE001 - user code at shutdown: reported, not raised
            log.warning("%s: env.close() raised %s: %s", owner, type(error).__name__, error)

    threads = []
    for owner, env in envs:
        thread = threading.Thread(
            target=close, args=(owner, env), name=f"{owner} env.close", daemon=True
        )
        thread.start()
        threads.append(thread)
    deadline = time.monotonic() + (ENV_CLOSE_GRACE_S if timeout is None else timeout)
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in threads if t.is_alive()]
