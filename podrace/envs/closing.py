"""Closing envs: user code that runs after a run's results are settled, and may fail or hang."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

ENV_CLOSE_GRACE_S = 10.0
"""Seconds all of a run's `env.close()` calls get together; a close still running after
that is left behind (an env subprocess that ignores its shutdown)."""

log = logging.getLogger(__name__)


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


__all__ = ["ENV_CLOSE_GRACE_S", "close_envs"]
