"""Event loops that let their pending tasks finish before they close, while orbax reads.

orbax runs each read on a fresh asyncio loop that it closes as soon as the read returns or
raises. When one tensorstore read fails (a damaged chunk), the others are still in flight
and, completing later, call back into the closed loop: "RuntimeError: Event loop is
closed" tracebacks on stderr after the one-line error. While podrace reads a checkpoint,
loops are made that first let their remaining tasks finish (bounded) when closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

DRAIN_S = 30.0
"""Longest a failed read waits for its other reads to finish before its loop is closed."""


class _DrainingLoop(asyncio.SelectorEventLoop):
    def close(self) -> None:
        if not self.is_closed() and not self.is_running():
            pending = [task for task in asyncio.all_tasks(self) if not task.done()]
            if pending:
                self.run_until_complete(asyncio.wait(pending, timeout=DRAIN_S))
                for task in pending:
                    task.cancel()
                self.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        super().close()


class _DrainingPolicy(asyncio.DefaultEventLoopPolicy):
    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return _DrainingLoop()


_policy_lock = threading.Lock()


@contextlib.contextmanager
def draining_loops() -> Iterator[None]:
    """Event loops made meanwhile (by orbax's run_sync) drain their tasks when closed."""
    with _policy_lock:
        previous = asyncio.get_event_loop_policy()
        asyncio.set_event_loop_policy(_DrainingPolicy())
        try:
            yield
        finally:
            asyncio.set_event_loop_policy(previous)


__all__ = ["DRAIN_S", "draining_loops"]
