"""Ray's own output, kept off the console and in the run directory (unless
`--ray.log-to-console`).

Ray's driver prints what its daemons send it (a raylet's report of a killed worker, often
with the raylet's state dump: dozens of lines) on the console whatever `log_to_driver`
says. Here those messages go to `ray.log` in the run directory instead (held until the run
directory exists), and a local Ray's logs (its daemons' and workers', under the private
temp dir that is removed at the end) are copied to the run directory's `ray-logs/` when the
run ends. podrace prints one line of its own per worker lost, restarted or joined
(`podrace.runtime.ray.collector`).
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LOG_NAME = "ray.log"
LOGS_DIR = "ray-logs"


class RayMessages:
    """Where Ray's messages to the driver go: held, then appended to `<run dir>/ray.log`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[str] = []
        self.run_dir: Path | None = None

    def write(self, data: dict[str, Any]) -> None:
        """One message as Ray's driver would print it (`lines`, from `pid`)."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        text = "".join(
            f"{stamp} ({data.get('pid', 'ray')}) {line}\n"
            for message in data.get("lines", ())
            for line in str(message).splitlines()
        )
        with self._lock:
            if self.run_dir is None:
                self._held.append(text)
            elif self.run_dir.is_dir():  # else discarded (a run stopped before its first update)
                with open(self.run_dir / LOG_NAME, "a") as f:
                    f.write(text)

    def attach(self, run_dir: Path) -> None:
        """From now on messages go to `run_dir`'s `ray.log` (the held ones first)."""
        with self._lock:
            self.run_dir = Path(run_dir)
            if self._held:
                with open(self.run_dir / LOG_NAME, "a") as f:
                    f.writelines(self._held)
                self._held.clear()

    def keep_logs(self, temp_dir: str) -> None:
        """Copy a local Ray's logs (`temp_dir`'s session) into the run directory."""
        if self.run_dir is None or not self.run_dir.is_dir():
            return  # the run has no directory (never had, or discarded): nothing keeps them
        logs = Path(temp_dir) / "session_latest" / "logs"
        if logs.is_dir():
            shutil.copytree(
                logs, self.run_dir / LOGS_DIR, dirs_exist_ok=True, ignore_dangling_symlinks=True
            )


@contextlib.contextmanager
def messages_to(messages: RayMessages) -> Iterator[None]:
    """While Ray runs in this process, the messages its driver prints from its daemons go to
    `messages`. Ray calls one function of its own for them (`print_to_stdstream`, from its
    error listener thread; its log forwarding, when on, holds its own reference): that
    function is swapped for the body of the `with`."""
    from ray._private import worker

    printing = worker.print_to_stdstream

    def keep(data: dict[str, Any], ignore_prefix: bool = False) -> None:
        messages.write(data)

    worker.print_to_stdstream = keep
    try:
        yield
    finally:
        worker.print_to_stdstream = printing


__all__ = ["LOGS_DIR", "LOG_NAME", "RayMessages", "messages_to"]
