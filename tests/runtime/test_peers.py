"""The peer link alone: hub and spokes as threads of this process, a dict as the store."""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field

import pytest

from podrace.runtime.multihost.peers import PeerLink, PeerLost, PeerStopped
from tests.waiting import wait_until


@dataclass
class Store:
    values: dict = field(default_factory=dict)
    cond: threading.Condition = field(default_factory=threading.Condition)

    def key_value_set(self, key, value):
        with self.cond:
            self.values[key] = value
            self.cond.notify_all()

    def blocking_key_value_get(self, key, timeout_ms):
        with self.cond:
            assert self.cond.wait_for(lambda: key in self.values, timeout_ms / 1000)
            return self.values[key]


@dataclass(frozen=True)
class FakeCluster:
    process_id: int
    num_processes: int
    store: Store
    coordinator: str = "127.0.0.1:1"
    timeout_s: float = 10.0

    def get(self, key):
        return self.store.blocking_key_value_get(key, self.timeout_s * 1000)


def open_links(n: int, timeout_s: float = 5.0, coordinator: str = "127.0.0.1:1"):
    store = Store()
    seen: dict[int, list[PeerLost]] = {i: [] for i in range(n)}
    links: dict[int, PeerLink] = {}

    def open_one(i):
        links[i] = PeerLink.open_through(FakeCluster(i, n, store, coordinator), timeout_s)

    threads = [threading.Thread(target=open_one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    for i, link in links.items():
        link.start(seen[i].append)
    return links, seen


def conn_to(link: PeerLink, process: int):
    """`link`'s connection to `process`."""
    (conn,) = [conn for conn in link._conns if conn.process == process]
    return conn


def heard_close(link: PeerLink, process: int) -> bool:
    """`link`'s reader of `process` has seen that connection close (and, for a loss, has
    reported it)."""
    return conn_to(link, process).gone.is_set()


@pytest.mark.timeout(30)
@pytest.mark.skipif(not socket.has_dualstack_ipv6(), reason="no IPv6 on this host")
def test_an_ipv6_coordinator_connects_every_process():
    """Process 0 listens on IPv6 too, not IPv4 only: with --distributed.coordinator [::1]:PORT
    every process connects (no refusal, no traceback on either process)."""
    links, _ = open_links(2, coordinator="[::1]:1")
    try:
        assert set(links) == {0, 1} and all(link._conns for link in links.values())
    finally:
        for link in links.values():
            link.close()


@pytest.mark.timeout(30)
def test_a_vanished_spoke_is_named_on_every_other_process():
    links, seen = open_links(3)
    try:
        links[2]._closed.set()
        for conn in links[2]._conns:  # process 2 "is killed": its socket closes, no goodbye
            conn.close()
        wait_until(lambda: seen[0] and seen[1])
        assert seen[0][0].process == 2 and "process 2 closed its connection" in str(seen[0][0])
        assert seen[1][0].process == 2 and "process 2" in str(seen[1][0])
        assert len(seen[0]) == len(seen[1]) == 1
    finally:
        for link in links.values():
            link.close()


@pytest.mark.timeout(30)
def test_done_then_gone_before_all_are_done_is_a_loss():
    """Process 1 finished, then was killed while process 0 still evaluated: a loss naming
    process 1, not a wait for it at JAX's shutdown barrier (630 s)."""
    links, seen = open_links(3)
    try:
        links[1].report_done()
        wait_until(lambda: conn_to(links[0], 1).done)  # the hub heard it
        links[1]._closed.set()
        for conn in links[1]._conns:  # killed: no goodbye
            conn.close()
        wait_until(lambda: seen[0])
        assert seen[0][0].process == 1 and "process 1 closed its connection" in str(seen[0][0])
    finally:
        for link in links.values():
            link.close()


@pytest.mark.timeout(30)
def test_a_failure_report_is_relayed():
    links, seen = open_links(3)
    try:
        links[0].report_failure("learner failed: ValueError: boom")
        wait_until(lambda: seen[2])
        assert seen[2][
            0
        ].process == 0 and "process 0 failed: learner failed: ValueError: boom" in str(seen[2][0])
    finally:
        for link in links.values():
            link.close()


@pytest.mark.timeout(30)
def test_every_process_waits_until_all_are_done_and_only_then_may_leave():
    links, seen = open_links(3)
    try:
        links[1].report_done()
        links[2].report_done()
        assert not links[1].wait_all_done(0.3) and not links[2].wait_all_done(
            0
        )  # process 0 still evaluates
        links[0].report_done()
        assert all(link.wait_all_done(5) for link in links.values())
        links[0].close()  # all done: leaving is no loss to anyone
        wait_until(lambda: heard_close(links[1], 0) and heard_close(links[2], 0))
        assert not any(seen.values())
    finally:
        for link in links.values():
            link.close()


@pytest.mark.timeout(30)
def test_process_0_lost_while_the_others_wait_for_it_is_a_loss_to_them():
    """Process 0 killed during its final evaluation: the spokes that finished hear it at
    once, not in JAX's shutdown barrier, which would abort them."""
    links, seen = open_links(3)
    try:
        links[1].report_done()
        links[2].report_done()
        wait_until(lambda: conn_to(links[0], 1).done and conn_to(links[0], 2).done)
        links[0]._closed.set()
        for conn in links[0]._conns:  # killed: no goodbye
            conn.close()
        wait_until(lambda: seen[1] and seen[2])
        assert "process 0 closed its connection before finishing" in str(seen[1][0])
        assert not links[1].wait_all_done(0)
    finally:
        for link in links.values():
            link.close()


@pytest.mark.timeout(30)
def test_a_stop_on_one_spoke_stops_the_others_with_its_signal():
    links, seen = open_links(3)
    try:
        links[2].report_stop(2, "SIGINT")
        wait_until(lambda: seen[0] and seen[1])
        for i in (0, 1):
            assert isinstance(seen[i][0], PeerStopped) and seen[i][0].signum == 2
            assert "process 2 received SIGINT" in str(seen[i][0])
    finally:
        for link in links.values():
            link.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["stop", "fail"])
def test_a_process_that_said_it_leaves_keeps_its_own_reason(how):
    """Ctrl-C on a spoke: the hub stops with it and closes its connection first; that close
    is no loss to the spoke, whose exit code must stay its signal's (not "process 0 closed
    its connection", exit 1, whenever the hub is quicker)."""
    links, seen = open_links(3)
    try:
        if how == "stop":
            links[1].report_stop(2, "SIGINT")
        else:
            links[1].report_failure("learner failed: ValueError: boom")
        wait_until(lambda: seen[0] and seen[2])
        links[0].close()  # the hub's process exits
        wait_until(lambda: heard_close(links[1], 0))
        assert not seen[1]
        assert seen[2][0].process == 1  # a spoke that did not leave still hears why
    finally:
        for link in links.values():
            link.close()


@pytest.mark.timeout(30)
def test_a_silent_process_is_lost_after_the_timeout():
    links, seen = open_links(2, timeout_s=1.0)
    try:
        links[1]._closed.set()  # stops beating but keeps the connection open (a hung host)
        wait_until(lambda: seen[0], timeout=10)
        assert "process 1 sent nothing for 1s" in str(seen[0][0])
    finally:
        for link in links.values():
            link.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["finished", "failed"])
def test_close_returns_at_once_whatever_the_peers_do(how):
    """Each link's reader threads sit in a blocking read: closing must wake them, not wait
    for the socket to time out (which would end every multi-process run peer_timeout_s
    late). The socket timeout here is far beyond the join below: a close that waited for it
    would still be running there."""
    links, seen = open_links(3, timeout_s=600.0)
    if how == "finished":
        for link in links.values():
            link.report_done()
        wait_until(lambda: all(link.wait_all_done(0) for link in links.values()))
    else:
        links[1].report_failure("boom")
        wait_until(lambda: seen[0] and seen[2])
    for i, link in links.items():  # every reader is back in its blocking read
        closing = threading.Thread(target=link.close)
        closing.start()
        closing.join(30)
        assert not closing.is_alive(), (how, i)


@pytest.mark.timeout(30)
def test_a_process_that_refuses_the_run_as_every_process_does_is_no_loss():
    """Every process raises RunRefused after the config agreement; one that leaves first
    (closing its link) must not make another, still comparing configs, exit 1 with PeerLost."""
    links, seen = open_links(3)
    try:
        links[1].report_refused()
        links[1].close()
        wait_until(lambda: heard_close(links[0], 1))
        links[0].report_refused()
        links[0].close()
        wait_until(lambda: heard_close(links[2], 0))
        assert seen == {0: [], 1: [], 2: []}
    finally:
        for link in links.values():
            link.close()


@pytest.mark.timeout(30)
def test_process_0_waits_for_the_others_past_a_stray_client_and_a_stop_closes_it():
    hub = PeerLink.listen(2)
    port = hub.getsockname()[1]
    with socket.create_connection(("127.0.0.1", port)) as stray:
        stray.sendall(b'{"process": [1]}\n')  # not a process of this run
        spoke = threading.Thread(
            target=lambda: PeerLink.open(1, 2, 5.0, f"127.0.0.1:{port}", 5.0).close()
        )
        spoke.start()
        link = PeerLink.open(0, 2, 5.0, hub, 5.0)
        spoke.join(5)
    assert [conn.process for conn in link._conns] == [1]
    link.close()

    class Stopped(Exception):
        pass

    def stop():
        raise Stopped

    hub = PeerLink.listen(2)
    with pytest.raises(Stopped):
        PeerLink.open(0, 2, 5.0, hub, 5.0, check=stop)
    assert hub.fileno() == -1  # closed: its port is not held after the stop


@pytest.mark.timeout(30)
def test_a_spoke_that_cannot_reach_process_0_has_lost_it():
    hub = PeerLink.listen(2)
    address = f"127.0.0.1:{hub.getsockname()[1]}"
    hub.close()
    with pytest.raises(PeerLost) as lost:
        PeerLink.open(1, 2, 5.0, address, 2.0)
    assert lost.value.process == 0 and "could not be reached" in str(lost.value)
