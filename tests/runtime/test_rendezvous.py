"""Processes meeting before jax.distributed (`podrace.runtime.rendezvous`), as threads."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from podrace.config import ConfigError
from podrace.runtime.rendezvous import rendezvous
from tests.runtime.test_multihost import free_port

pytestmark = pytest.mark.timeout(60)


def meet(port: int, claims: list[tuple[int, int]], timeout_s: float = 10.0) -> list[str]:
    """Each (process id, process count) in its own thread; "ok" or the ConfigError of each."""
    outcomes = [""] * len(claims)

    def one(i: int, process: int, count: int) -> None:
        try:
            rendezvous(f"127.0.0.1:{port}", count, process, timeout_s)
            outcomes[i] = "ok"
        except ConfigError as error:
            outcomes[i] = str(error)

    threads = [threading.Thread(target=one, args=(i, *claim)) for i, claim in enumerate(claims)]
    for thread in reversed(threads):  # the others first: they wait for process 0 to listen
        thread.start()
        time.sleep(0.05)
    for thread in threads:
        thread.join(30)
    return outcomes


def test_every_process_returns_once_all_met_and_the_port_is_free_again():
    port = free_port()
    assert meet(port, [(0, 3), (1, 3), (2, 3)]) == ["ok", "ok", "ok"]
    with socket.create_server(("", port)):  # what JAX's service does next
        pass


def test_a_process_that_never_starts_is_named_by_process_0_within_the_timeout():
    start = time.monotonic()
    [error] = meet(free_port(), [(0, 2)], timeout_s=1.0)
    assert time.monotonic() - start < 5
    assert error.startswith("distributed: process(es) [1] did not join within 1s")


def test_a_process_whose_process_0_never_listens_says_where_it_looked():
    port = free_port()
    [error] = meet(port, [(1, 2)], timeout_s=1.0)
    assert error.startswith(f"distributed: process 0 at 127.0.0.1:{port} did not answer within 1s")


def test_disagreeing_process_counts_fail_every_process_that_is_there():
    outcomes = meet(free_port(), [(0, 2), (1, 3)])
    expected = "distributed: processes disagree on --distributed.num-processes: process 0 says 2, process 1 says 3"
    assert outcomes == [expected, expected]


def test_two_processes_with_one_id_fail_without_waiting_for_the_timeout():
    start = time.monotonic()
    outcomes = meet(free_port(), [(0, 3), (1, 3), (1, 3)], timeout_s=20.0)
    assert time.monotonic() - start < 10
    assert outcomes == ["distributed: two processes say they are process 1"] * 3


def test_a_stray_connection_is_not_a_process_and_a_busy_port_is_one_line():
    port = free_port()
    stray = socket.create_connection  # connects once process 0 listens, then says nothing

    def poke() -> None:
        for _ in range(100):
            try:
                with stray(("127.0.0.1", port), timeout=1) as s:
                    s.sendall(b"GET / HTTP/1.0\r\n\r\n")
                    s.recv(100)
                return
            except OSError:
                time.sleep(0.02)

    poker = threading.Thread(target=poke)
    poker.start()
    assert meet(port, [(0, 2), (1, 2)]) == ["ok", "ok"]
    poker.join(10)
    with socket.create_server(("127.0.0.1", port)):
        with pytest.raises(ConfigError, match=f"cannot listen on port {port}"):
            rendezvous(f"127.0.0.1:{port}", 2, 0, 1.0)
