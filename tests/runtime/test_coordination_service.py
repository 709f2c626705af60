"""Process 0's coordination service in a child process (runtime.multihost.coordination_service)."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from subprocess import Popen

import pytest

from podrace.runtime.multihost.coordination_service import (
    LINGER_S,
    HostedService,
    stop_hosted_service,
)
from tests.runtime.multihost_processes import free_port, processes, service_child
from tests.waiting import wait_until

JOIN = """
import sys, time
import jax
from jax._src import distributed
from podrace.runtime.multihost.coordination_service import hosted_service

process = int(sys.argv[2])
with hosted_service():
    jax.distributed.initialize(sys.argv[1], 2, process, initialization_timeout=60)
child = getattr(distributed.global_state.service, "child", None)
print("joined", child.pid if child is not None else "-", flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    """Running (an exited child of a killed parent may stay a zombie where nothing reaps it)."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_killed_process_0_does_not_abort_the_others():
    """With JAX's service inside process 0, process 1's JAX client would abort it (exit -6)
    the moment process 0 is killed, before the peer link could end it with its line: the
    service outlives a killed process 0 for a while, then stops of itself."""
    address = f"127.0.0.1:{free_port()}"
    with processes([[sys.executable, "-c", JOIN, address, str(i)] for i in range(2)]) as procs:
        service_pid = procs[0].stdout.readline().split()[1]
        assert procs[1].stdout.readline().startswith("joined")
        os.killpg(procs[0].pid, signal.SIGKILL)  # its whole process group, as a terminal would
        procs[0].wait()
        # Nothing marks the moment an abort would have come: process 1 has 3 s (of the
        # service's 10 s linger) to abort. A loaded machine gives it less, never a false fail.
        time.sleep(3)
        assert procs[1].poll() is None, procs[1].communicate()[1][-2000:]
        service_pid = int(service_pid)
        assert alive(service_pid)
    wait_until(  # then it stops of itself
        lambda: not alive(service_pid),
        LINGER_S + 15,
        lambda: "the orphaned service never exited",
        interval=0.2,
    )


@pytest.mark.timeout(60)
def test_a_stopped_service_exits_at_once():
    service = HostedService(
        f"127.0.0.1:{free_port()}", 2, heartbeat_timeout=100, shutdown_timeout=10
    )
    start = time.monotonic()
    service.shutdown()
    assert service.child.returncode == 0 and time.monotonic() - start < 5


@pytest.mark.timeout(60)
def test_a_service_that_cannot_start_is_an_error_in_process_0():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError) as raised:
            HostedService(f"127.0.0.1:{port}", 2, heartbeat_timeout=100)
    assert str(raised.value), raised.value


def ignored(pid: int) -> set[int]:
    """The signals process `pid` ignores."""
    with open(f"/proc/{pid}/status") as f:
        mask = int(next(ln for ln in f if ln.startswith("SigIgn:")).split()[1], 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


def test_the_child_ignores_a_terminals_ctrl_c():
    """Started in its own session; SIGINT is ignored too, in case it is sent to it alone."""
    service = HostedService(f"127.0.0.1:{free_port()}", 2)
    try:
        assert os.getsid(service.child.pid) == service.child.pid
        assert signal.SIGINT in ignored(service.child.pid)
        service.child.send_signal(signal.SIGINT)
    finally:
        service.shutdown()
    assert service.child.returncode == 0  # it stopped when told, not at the SIGINT before


@pytest.mark.timeout(60)
def test_stopping_the_hosted_service_returns_at_once_and_the_child_exits():
    """Process 0 leaving after a failure or a stop: no wait, and no lingering child."""
    service = HostedService(f"127.0.0.1:{free_port()}", 2)
    child, waits = service.child, []
    child.wait = lambda *args, **kwargs: waits.append(args) or Popen.wait(child, *args, **kwargs)
    child.communicate = lambda *args, **kwargs: (
        waits.append(args) or Popen.communicate(child, *args, **kwargs)
    )
    stop_hosted_service()
    assert waits == []  # told the child and returned: no wait for it
    del child.wait, child.communicate
    service.child.wait(15)
    assert service.child.returncode == 0


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.timeout(60)
def test_process_0_leaving_while_its_service_starts_stops_it_before_it_takes_the_port():
    """Process 0 leaving before its service child said ready (a peer lost while JAX started)
    still stops the child, which would otherwise take the coordinator's port after process 0
    had gone."""
    import threading

    port = free_port()
    HostedService.current = None
    errors = []

    def start():
        try:
            HostedService(f"127.0.0.1:{port}", 2)
        except RuntimeError as error:
            errors.append(error)

    starting = threading.Thread(target=start)
    starting.start()
    # spawned: it imports JAX for a second
    child = wait_until(lambda: service_child(os.getpid()), 10, interval=0.001)
    stop_hosted_service()
    starting.join(15)
    taken = []

    def gone() -> bool:
        taken.append(listening(port))
        return not alive(child)

    wait_until(gone, 30, interval=0.05)  # the child goes, never having taken the port
    assert not any(taken) and not listening(port) and errors
    HostedService.current = None


@pytest.mark.timeout(60)
def test_process_0_leaving_while_its_services_child_is_spawned_never_lets_it_serve(monkeypatch):
    """Process 0 leaving while Popen is still returning (the child exists, but
    stop_hosted_service does not know the service yet) must not let the child take the
    coordinator's port after process 0 has gone. Here the leave lands in that window every
    time; the port must never be taken, not even for a moment."""
    import subprocess
    import threading

    from podrace.runtime.multihost import coordination_service

    spawn = subprocess.Popen

    def spawn_then_leave(*args, **kwargs):
        child = spawn(*args, **kwargs)
        stop_hosted_service()  # another thread of process 0 leaving, before Popen returned
        return child

    monkeypatch.setattr(coordination_service.subprocess, "Popen", spawn_then_leave)
    port = free_port()
    taken, done = [], threading.Event()

    def watch():
        while not done.is_set():
            if listening(port):
                taken.append(True)
            time.sleep(0.005)  # a watcher's sampling interval

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with pytest.raises(
            RuntimeError, match="process 0 left while its coordination service started"
        ):
            HostedService(f"127.0.0.1:{port}", 2)
        service = HostedService.current
        # Reaped: a child left alone would have taken the port later; this one cannot.
        assert service.child.returncode is not None
    finally:
        done.set()
        watcher.join()
        HostedService.current = None
    assert not taken
