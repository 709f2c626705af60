"""A side channel between the processes of a run: liveness, failures and stops.

Collectives cannot say *who* went missing, and a process waiting in one may wait for a
long time. So process 0 (the hub) keeps one TCP connection to every other process (a
spoke), apart from jax.distributed. Each side sends a beat every `timeout_s / 4`:

- a connection that closes before every process said `done` means its process exited or
  was killed (noticed at once, SIGKILL included; one that said `done` and then vanished
  would leave the others at JAX's shutdown barrier); silence for `timeout_s` means it hung;
- `done` comes at the end of a process's whole run (process 0's final evaluation included),
  and every process waits, still listening, until all are done (`wait_all_done`) before it
  leaves jax.distributed: a loss or a stop meanwhile is heard here, not by JAX's shutdown
  barrier (which aborts the process);
- a process that fails or is interrupted says so (`fail` / `stop`) before it shuts down;
- the hub relays every such event to all other spokes, so every process learns, within a
  bounded time, which process was lost and why, and stops with that as its error;
- a process that said it stops or fails has its own reason: the others then stop too and
  close their connections, which is no loss to it (its exit code stays its own).

The link opens before jax.distributed starts where a rendezvous ran (`distributed.meet`
hands out the hub's port), so a process lost while JAX registers the processes or while
they agree on the config is noticed too; otherwise the hub's address travels through
jax.distributed's key-value store. Messages are JSON lines.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable

from podrace.runtime.multihost.rendezvous import host_of, listen_on_all_addresses, send_line

_ADDRESS_KEY = "podrace/peers/hub"
_POLL_S = 0.2
"""How often process 0, waiting for the others to connect, checks for a stop."""


class PeerLost(RuntimeError):
    """Another process exited, was killed, hung, or failed; the run cannot go on without it."""

    def __init__(self, process: int, message: str):
        super().__init__(message)
        self.process = process


class PeerStopped(PeerLost):
    """Another process was interrupted (Ctrl-C, SIGTERM); every process stops with it."""

    def __init__(self, process: int, signum: int, message: str):
        super().__init__(process, message)
        self.signum = signum


OnLost = Callable[[PeerLost], None]


class _Conn:
    """One JSON-lines connection; sends are serialized, failures to send are ignored
    (the reader notices a dead peer)."""

    def __init__(self, sock: socket.socket, process: int):
        self.sock, self.process = sock, process
        self.lock = threading.Lock()
        self.done = False
        self.refused = False
        """It refuses the run as this process will: its close is no loss."""
        self.gone = threading.Event()
        """Its reader has ended: the other side closed (exited) or this side closed."""
        self.reader = sock.makefile("r", encoding="utf-8")

    def send(self, **message) -> None:
        with self.lock:
            send_line(self.sock, message)

    def recv(self) -> dict | None:
        line = self.reader.readline()
        return json.loads(line) if line else None

    def close(self) -> None:
        # Shut the socket down first: that wakes this side's reader thread, blocked in
        # readline holding the reader's lock, which reader.close() would otherwise wait for
        # until the socket timed out (peer_timeout_s: every multi-process run ended that late).
        for close in (
            lambda: self.sock.shutdown(socket.SHUT_RDWR),
            self.reader.close,
            self.sock.close,
        ):
            try:
                close()
            except OSError:  # already closed or shut down by the other side
                pass


class PeerLink:
    """This process's end of the side channel: `open` connects, `start(on_lost)` starts
    listening; `on_lost` is called once, from a link thread, with the first PeerLost
    (this process should then stop)."""

    def __init__(self, process_id: int, num_processes: int, timeout_s: float):
        self.process_id, self.num_processes, self.timeout_s = process_id, num_processes, timeout_s
        self._on_lost: OnLost = lambda lost: None
        self._conns: list[_Conn] = []
        self._lost: PeerLost | None = None
        self._event = threading.Event()
        self._closed = threading.Event()
        self._leaving = False  # this process said it stops or fails: no later loss is its reason
        self._done_here = False
        self._all_done = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._server: socket.socket | None = None

    # -- setup --------------------------------------------------------------------------
    @staticmethod
    def listen(num_processes: int) -> socket.socket:
        """Process 0's listening socket, made before the others learn its port."""
        return listen_on_all_addresses(0, backlog=max(1, num_processes))

    @classmethod
    def open(
        cls,
        process_id: int,
        num_processes: int,
        timeout_s: float,
        hub: socket.socket | str,
        wait_s: float,
        check: Callable[[], None] = lambda: None,
    ) -> PeerLink:
        """Connect every process to process 0; returns once all are connected. `hub` is
        process 0's listening socket (`listen`) there and its HOST:PORT elsewhere; `wait_s`
        bounds the wait for the others, and `check` is called while waiting (a stop raises)."""
        link = cls(process_id, num_processes, timeout_s)
        if isinstance(hub, socket.socket):
            link._server = hub
            try:
                link._accept_all(hub, wait_s, check)
            except BaseException:
                link.close()
                raise
        else:
            host, _, port = hub.rpartition(":")
            try:
                sock = socket.create_connection((host.strip("[]"), int(port)), timeout=wait_s)
            except OSError as error:
                raise PeerLost(
                    0, f"process 0 could not be reached at {hub}: {error.strerror or error}"
                ) from None
            conn = _Conn(sock, 0)
            conn.send(kind="hello", process=process_id)
            link._conns.append(conn)
        for conn in link._conns:
            conn.sock.settimeout(timeout_s)
        return link

    def _accept_all(self, hub: socket.socket, wait_s: float, check: Callable[[], None]) -> None:
        deadline = time.monotonic() + wait_s
        waiting = set(range(1, self.num_processes))
        while waiting:
            check()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PeerLost(
                    min(waiting), f"process(es) {sorted(waiting)} never connected to process 0"
                )
            hub.settimeout(min(_POLL_S, remaining))
            try:
                sock, _ = hub.accept()
            except TimeoutError:
                continue
            sock.settimeout(min(5.0, max(0.01, remaining)))  # a stray client stalls it no longer
            conn = _Conn(sock, -1)
            try:
                hello = conn.recv() or {}
            except (OSError, ValueError):
                hello = {}
            process = hello.get("process")
            if (
                not isinstance(process, int) or process not in waiting
            ):  # not a process of this run (a port scanner), or a twin
                conn.close()
                continue
            conn.process = process
            waiting.discard(process)
            self._conns.append(conn)

    @classmethod
    def open_through(cls, cluster, timeout_s: float) -> PeerLink:
        """`open`, process 0's address passing through jax.distributed's key-value store
        (where no rendezvous ran before it: JAX detected the processes)."""
        if cluster.process_id == 0:
            hub = cls.listen(cluster.num_processes)
            cluster.store.key_value_set(
                _ADDRESS_KEY, f"{host_of(cluster.coordinator)}:{hub.getsockname()[1]}"
            )
        else:
            hub = cluster.get(_ADDRESS_KEY)
        return cls.open(
            cluster.process_id, cluster.num_processes, timeout_s, hub, cluster.timeout_s
        )

    def on_lost(self, callback: OnLost) -> None:
        """Call `callback` instead on a loss from now on (at once if one already happened)."""
        with self._lock:
            self._on_lost = callback
            lost = self._lost
        if lost is not None:
            callback(lost)

    def start(self, on_lost: OnLost) -> None:
        self._on_lost = on_lost
        for conn in self._conns:
            self._spawn(f"peer-{conn.process}", lambda c=conn: self._read(c))
        self._spawn("peer-beat", self._beat)

    def _spawn(self, name: str, fn: Callable[[], None]) -> None:
        thread = threading.Thread(target=fn, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    # -- what this process tells the others ---------------------------------------------
    def report_failure(self, message: str) -> None:
        """This process failed: tell the others (relayed by the hub) before shutting down."""
        self._leaving = True
        self._broadcast(kind="fail", origin=self.process_id, message=message)

    def report_stop(self, signum: int, name: str) -> None:
        """This process was interrupted: every other process stops too."""
        self._leaving = True
        self._broadcast(kind="stop", origin=self.process_id, signum=signum, message=name)

    def report_refused(self) -> None:
        """This process refuses the run, as every process does (each saw the same config
        posts: `RunRefused`): its connections closing is no loss to the others."""
        self._leaving = True
        self._broadcast(kind="refused", origin=self.process_id)

    def report_done(self) -> None:
        """This process finished its whole run; see `wait_all_done`."""
        self._done_here = True
        if self.process_id == 0:
            self._check_all_done()
        else:
            self._broadcast(kind="done", origin=self.process_id)

    def wait_all_done(self, timeout: float) -> bool:
        """Whether every process has said `done` (waiting up to `timeout`). Until then a
        connection that closes is a loss; after, none is."""
        return self._all_done.wait(timeout)

    def _check_all_done(self) -> None:
        """The hub: once it and every spoke are done, tell the spokes."""
        with self._lock:
            if self._all_done.is_set() or not (
                self._done_here and all(c.done for c in self._conns)
            ):
                return
            self._all_done.set()
        self._broadcast(kind="all_done", origin=0)

    def _broadcast(self, **message) -> None:
        for conn in self._conns:
            conn.send(**message)

    # -- what happened to the others ------------------------------------------------------
    @property
    def lost(self) -> PeerLost | None:
        return self._lost

    def wait_lost(self, timeout: float) -> PeerLost | None:
        """The first peer loss, waiting up to `timeout` for one (e.g. after a collective failed)."""
        self._event.wait(timeout)
        return self._lost

    def _declare(self, error: PeerLost, relay_from: _Conn | None) -> None:
        with self._lock:
            if self._lost is not None or self._closed.is_set() or self._leaving:
                return
            self._lost = error
            on_lost = self._on_lost
        if self.process_id == 0:  # relay to every other spoke
            kind = "stop" if isinstance(error, PeerStopped) else "fail"
            extra = {"signum": error.signum} if isinstance(error, PeerStopped) else {}
            for conn in self._conns:
                if conn is not relay_from:
                    conn.send(
                        kind=kind, origin=error.process, message=str(error), relayed=True, **extra
                    )
        on_lost(error)  # first: the run records this loss before anyone woken below
        self._event.set()

    def _read(self, conn: _Conn) -> None:
        try:
            self._read_until_closed(conn)
        finally:
            conn.gone.set()

    def wait_others_gone(self, timeout: float) -> None:
        """The hub, leaving after a loss or a stop: wait (up to `timeout`) until every other
        process has closed its connection, i.e. exited. The hub's process holds JAX's
        coordination service; leaving first made a process still stopping cleanly abort
        (exit 134, JAX's fatal error and a stack trace)."""
        if self.process_id != 0:
            return
        deadline = time.monotonic() + timeout
        for conn in self._conns:
            conn.gone.wait(max(0.0, deadline - time.monotonic()))

    def _read_until_closed(self, conn: _Conn) -> None:
        who = conn.process
        while not self._closed.is_set():
            try:
                message = conn.recv()
            except TimeoutError:
                if not self._all_done.is_set():
                    self._declare(
                        PeerLost(
                            who,
                            f"process {who} sent nothing for {self.timeout_s:g}s "
                            "(hung or unreachable)",
                        ),
                        conn,
                    )
                return
            except (OSError, ValueError):
                message = None
            if message is None:
                if not self._all_done.is_set() and not self._closed.is_set() and not conn.refused:
                    self._declare(
                        PeerLost(
                            who,
                            f"process {who} closed its connection before finishing "
                            "(it exited or was killed)",
                        ),
                        conn,
                    )
                return
            kind = message.get("kind")
            origin = int(message.get("origin", who))
            if kind == "done" and origin == who:  # at the hub
                conn.done = True
                self._check_all_done()
            elif kind == "all_done":  # at a spoke: the hub may close its end now
                self._all_done.set()
            elif kind == "refused" and origin == who:
                conn.refused = True
            elif kind == "fail":
                text = (
                    message["message"]
                    if message.get("relayed")
                    else f"process {origin} failed: {message['message']}"
                )
                self._declare(PeerLost(origin, text), conn)
            elif kind == "stop":
                signum = int(message.get("signum", 2))
                text = (
                    message["message"]
                    if message.get("relayed")
                    else f"process {origin} received {message['message']}"
                )
                self._declare(PeerStopped(origin, signum, text), conn)

    def _beat(self) -> None:
        while not self._closed.wait(self.timeout_s / 4):
            self._broadcast(kind="beat")

    def close(self) -> None:
        self._closed.set()
        for conn in self._conns:
            conn.close()
        if self._server is not None:
            self._server.close()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(1.0)
