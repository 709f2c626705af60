"""Ctrl-C of a library caller: `podrace.train` in the main thread stops the run as the CLI does."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from podrace.control import Lifetime


def _never() -> int | None:
    return None


@contextmanager
def interrupts_stop(lifetime: Lifetime) -> Iterator[Callable[[], int | None]]:
    """For a run a library caller starts in the main thread while Python's own SIGINT
    handling is in place: Ctrl-C stops `lifetime` as in the CLI (the run saves, writes its
    last line and releases its directory; a run stopped before its first update leaves no
    directory) and KeyboardInterrupt is raised once the block has ended; a second Ctrl-C
    raises it at once. Python's handler would raise it wherever the main thread is, inside
    JAX's tracing or an import too, which leaves JAX broken for the rest of the process (a
    segfault some calls later). Elsewhere (another thread, a handler of the caller's, the
    CLI) it does nothing.

    Yields a function that returns the signal received so far (None: none). The handler
    only records the signal; a thread of its own stops the run (`stop` takes locks the
    interrupted main thread may hold)."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield _never
        return
    from podrace.control import Stopped

    received: list[int] = []
    done = threading.Event()
    signalled = threading.Event()  # set only by the handler; no other code takes its lock

    def handle(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
        if received:
            raise KeyboardInterrupt
        received.append(signum)
        signalled.set()

    def stop_on_signal() -> None:
        signalled.wait()
        if not done.is_set():
            lifetime.stop("SIGINT received")

    stopper = threading.Thread(target=stop_on_signal, name="podrace-interrupt", daemon=True)
    stopper.start()
    signal.signal(signal.SIGINT, handle)
    try:
        yield lambda: received[0] if received else None
    except Stopped:
        if not received:
            raise
        raise KeyboardInterrupt from None
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        done.set()
        signalled.set()
        stopper.join()
    if received:
        raise KeyboardInterrupt


__all__ = ["interrupts_stop"]
