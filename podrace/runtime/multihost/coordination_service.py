"""jax.distributed's coordination service in a child process of process 0, not inside it.

JAX runs the service inside process 0, and every other process's JAX client aborts its
process (exit -6, a C++ stack trace) the moment the service is gone. A process 0 killed
(SIGKILL, OOM) would therefore race the peer link, which ends the others with one clear
line (`podrace: error: process-0 failed: PeerLost ...`), and the abort could win. Hosted here
in a child of its own session, the service outlives its parent by `LINGER_S`, long enough
for the peer link to end every other process first, and then exits. A process 0 that
leaves stops it at once: through jax.distributed.shutdown after a run, or with
`stop_hosted_service` after a failure or a stop, once the others have left (the peer link
waits for them), so the coordinator's port is free again for the next run.

`hosted_service` is used while jax.distributed.initialize runs: it puts `HostedService` in
place of JAX's service factory, so JAX's own arguments (address, sizes, timeouts, TLS) reach
the child unchanged.

    python -m podrace.runtime.multihost.coordination_service ARGS_JSON   (the child; reads stdin)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

LINGER_S = 10.0
"""How long the service stays up after process 0 vanished without stopping it (the peer link
ends the others within a second; the coordinator's port stays taken meanwhile)."""
STOP = b"stop\n"
SHUTDOWN_WAIT_S = 10.0
"""How long the child lets the service shut down gracefully before it exits regardless."""


class HostedService:
    """Stands where JAX keeps its DistributedRuntimeService: the child holding it."""

    current: HostedService | None = None
    """This process's hosted service, if it is process 0."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._lock = threading.Lock()
        self._stopped = False
        self.child: subprocess.Popen | None = None
        self.ready = False
        # Known before the child exists: process 0 leaving meanwhile (a peer lost while JAX
        # starts) must stop it too, or it would take the port after process 0 has gone.
        HostedService.current = self
        child = subprocess.Popen(
            [sys.executable, "-m", __name__, json.dumps([list(args), kwargs])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # JAX's service logs; failures come back on stdout
            start_new_session=True,  # not in process 0's group: a kill of that group spares it
        )
        with self._lock:
            self.child = child
            stopped = self._stopped
        if stopped:  # stopped while Popen ran: it never serves
            child.kill()
        answer = child.stdout.readline().decode(errors="replace").strip()
        with self._lock:
            left = self._stopped
            self.ready = answer == "ready" and not left
        if not self.ready:
            child.kill()  # a no-op unless it said ready as process 0 left
            child.wait()
            raise RuntimeError(
                "process 0 left while its coordination service started"
                if left
                else answer or f"the coordination service exited with code {child.returncode}"
            )

    def stop(self) -> None:
        """Tell the child to stop the service and exit; returns at once. A child not ready
        yet serves no one: it is killed (or never runs, if it does not exist yet)."""
        with self._lock:
            self._stopped = True
            child = self.child
            ready = self.ready
        if child is None:
            return
        if not ready:
            with contextlib.suppress(OSError):
                child.kill()
            return
        with contextlib.suppress(OSError, ValueError):  # already told, or the child is gone
            child.stdin.write(STOP)
            child.stdin.close()

    def shutdown(self) -> None:
        """Stop the service and wait for the child (JAX calls this in jax.distributed.shutdown,
        after its barrier)."""
        self.stop()
        try:
            self.child.wait(SHUTDOWN_WAIT_S + 5)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()


def stop_hosted_service() -> None:
    """Process 0 leaving without jax.distributed.shutdown (a failure, a stop): free the
    coordinator's port now instead of after `LINGER_S`. A no-op in any other process."""
    if HostedService.current is not None:
        HostedService.current.stop()


@contextlib.contextmanager
def hosted_service() -> Iterator[None]:
    """While jax.distributed.initialize runs, process 0's service starts as a child."""
    from jax._src import distributed as jax_distributed

    lib = jax_distributed._jax
    factory = lib.get_distributed_runtime_service
    lib.get_distributed_runtime_service = HostedService
    try:
        yield
    finally:
        lib.get_distributed_runtime_service = factory


def _serve(args: list, kwargs: dict) -> None:
    """The child: start the service, say "ready", hold it until stopped or orphaned."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # its lifetime is process 0's, not a terminal's
    try:
        from jax._src.lib import _jax

        service = _jax.get_distributed_runtime_service(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - reported to process 0, which raises it
        print(str(error).strip().splitlines()[0] if str(error).strip() else repr(error), flush=True)
        os._exit(1)
    print("ready", flush=True)
    if sys.stdin.buffer.readline() == STOP:
        # A client that never said goodbye (a hung process) must not keep it up.
        stopping = threading.Thread(target=service.shutdown, daemon=True)
        stopping.start()
        stopping.join(SHUTDOWN_WAIT_S)
    else:  # process 0 is gone: give the others time to notice it and leave
        time.sleep(LINGER_S)
    os._exit(0)


if __name__ == "__main__":
    _serve(*json.loads(sys.argv[1]))
