"""Processes meeting before jax.distributed (`podrace.runtime.multihost.rendezvous`), as threads."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from podrace.config import ConfigError
from podrace.runtime.multihost.rendezvous import rendezvous
from tests.runtime.multihost_processes import free_port
from tests.waiting import wait_until

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
        time.sleep(0.05)  # staggered starts, the scenario (not a wait: any order must work)
    for thread in threads:
        thread.join(30)
    return outcomes


def test_every_process_returns_once_all_met_and_the_port_is_free_again():
    port = free_port()
    assert meet(port, [(0, 3), (1, 3), (2, 3)]) == ["ok", "ok", "ok"]
    with socket.create_server(("", port)):  # what JAX's service does next
        pass


def test_a_process_that_never_starts_is_named_by_process_0_within_the_timeout():
    """The meeting's own timeout ends it (its message), not `meet`'s 30 s join."""
    [error] = meet(free_port(), [(0, 2)], timeout_s=1.0)
    assert error.startswith("distributed: process(es) [1] did not join within 1s")


def test_a_process_whose_process_0_never_listens_says_where_it_looked():
    port = free_port()
    [error] = meet(port, [(1, 2)], timeout_s=1.0)
    assert error.startswith(f"distributed: process 0 at 127.0.0.1:{port} did not answer within 1s")


def test_disagreeing_process_counts_fail_every_process_that_is_there():
    outcomes = meet(free_port(), [(0, 2), (1, 3)])
    expected = (
        "distributed: processes disagree on --distributed.num-processes: "
        "process 0 says 2, process 1 says 3"
    )
    assert outcomes == [expected, expected]


def test_two_processes_with_one_id_fail_without_waiting_for_the_timeout():
    """A timeout far beyond `meet`'s 30 s join: a meeting that waited for it would leave its
    outcome empty."""
    outcomes = meet(free_port(), [(0, 3), (1, 3), (1, 3)], timeout_s=600.0)
    assert outcomes == ["distributed: two processes say they are process 1"] * 3


def test_a_stray_connection_is_not_a_process_and_a_busy_port_is_one_line():
    port = free_port()
    stray = socket.create_connection  # connects once process 0 listens, then says nothing

    def poked() -> bool:
        try:
            with stray(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET / HTTP/1.0\r\n\r\n")
                s.recv(100)
            return True
        except OSError:
            return False

    poker = threading.Thread(target=lambda: wait_until(poked, 20, interval=0.02))
    poker.start()
    assert meet(port, [(0, 2), (1, 2)]) == ["ok", "ok"]
    poker.join(10)
    with socket.create_server(("127.0.0.1", port)):
        with pytest.raises(ConfigError, match=f"cannot listen on port {port}"):
            rendezvous(f"127.0.0.1:{port}", 2, 0, 1.0)


@pytest.mark.slow
def test_a_process_waits_for_the_answer_of_a_process_0_that_started_after_it():
    """With staggered starts, process 1 waits for the answer of a process 0 started after it,
    not just until its own deadline: process 0, still waiting for process 2, would then
    answer "ok" to process 2 alone and JAX abort both (exit 134)."""
    port = free_port()
    outcomes: dict[int, str] = {}

    def one(process: int, delay: float) -> None:
        time.sleep(delay)  # a process started late: the scenario
        try:
            rendezvous(f"127.0.0.1:{port}", 3, process, 4.0)
            outcomes[process] = "ok"
        except ConfigError as error:
            outcomes[process] = str(error)

    # Process 1 times out at 4 s (+ 2 s for an answer in flight); process 0, up at 3 s,
    # waits until 7 s; process 2 comes at 6.5 s.
    threads = [threading.Thread(target=one, args=args) for args in ((1, 0.0), (0, 3.0), (2, 6.5))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert outcomes == {0: "ok", 1: "ok", 2: "ok"}


def test_a_process_that_left_after_its_hello_fails_the_meeting_for_everyone():
    import json

    port = free_port()
    outcomes: dict[int, str] = {}

    def one(process: int) -> None:
        try:
            rendezvous(f"127.0.0.1:{port}", 3, process, 10.0)
            outcomes[process] = "ok"
        except ConfigError as error:
            outcomes[process] = str(error)

    hub = threading.Thread(target=one, args=(0,))
    hub.start()
    hello = {"hello": "podrace-rendezvous/1", "process": 1, "num_processes": 3}

    def said_hello_and_left() -> bool:  # process 1 says hello, then is gone (killed, or gave up)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as quitter:
                quitter.sendall((json.dumps(hello) + "\n").encode())
            return True
        except OSError:  # process 0 does not listen yet
            return False

    wait_until(said_hello_and_left, 20, interval=0.02)
    one(2)  # accepted after process 1, whose hello and close came first
    hub.join(30)
    expected = "distributed: process(es) [1] left before every process had joined"
    assert outcomes == {0: expected, 2: expected}


def connected(port: int) -> socket.socket | None:
    """A connection to process 0, once it listens."""
    try:
        return socket.create_connection(("127.0.0.1", port))
    except OSError:
        return None


@pytest.mark.parametrize("process", [0, 1])
def test_a_stop_ends_the_wait_at_once(process):
    """Ctrl-C while waiting in the meeting ends the wait: the wait calls `check` over and
    over, and the stop that its third call raises comes straight out of the meeting (not
    a timeout error after the meeting's 600 s, which the test's own timeout would end)."""

    class Stop(Exception):
        pass

    calls = []

    def check() -> None:
        calls.append(None)
        if len(calls) == 3:
            raise Stop

    with pytest.raises(Stop):
        rendezvous(f"127.0.0.1:{free_port()}", 2, process, 600.0, check)
    assert len(calls) == 3


def test_a_process_stopped_after_its_hello_is_a_refusal_not_a_twin():
    """Three processes: process 1 said hello, then was stopped while process 2 was still
    awaited; its refusal (`refuse`, from a new connection) ends the run with its reason."""
    from podrace.runtime.multihost.rendezvous import refuse

    port = free_port()
    outcome = []
    gathering = threading.Thread(
        target=lambda: outcome.append(meet(port, [(0, 3)], timeout_s=5.0)[0])
    )
    gathering.start()
    hello = wait_until(lambda: connected(port))
    with hello:
        hello.sendall(b'{"hello": "podrace-rendezvous/1", "process": 1, "num_processes": 3}\n')
    # Process 0 accepts in order: it reads this hello before the refusal's connection.
    refuse(f"127.0.0.1:{port}", 3, 1, "it was stopped (SIGINT received)", 2.0)
    [error] = meet(port, [(2, 3)])
    gathering.join(10)
    assert (
        error == outcome[0] == "distributed: process 1 cannot run: it was stopped (SIGINT received)"
    )
