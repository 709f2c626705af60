"""A Unix-socket doorbell between one publisher process and its subscriber processes.

Shared memory holds the data; this only wakes sleepers and carries acknowledgements:

* publisher -> subscriber: a few bytes after each publish (content ignored; readers look at
  shared memory for the truth). The kernel closes the socket when the publisher process
  dies, so a blocked reader learns at once that its publisher went away.
* subscriber -> publisher: "hello <name>" then "ack <version>" lines, so the publisher can
  report every subscriber's acknowledged version (a name already connected gets a suffix).

Sends are non-blocking and best effort: a reader that already has wake-ups queued needs no
more, and a stuck reader can never block the publisher.

Sockets never cross a fork: a child that kept copies would hold a dead publisher's
connections open (its readers would wait forever, the sweep would think it alive), and a
`shutdown()` of a shared socket in the child would cut the parent's connection. So a fork
child closes its copies at once (the descriptors only: the parent's connections stay as they
were); the inherited objects are dead in the child, and subscribers re-attach (see `shm`).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable

_LINUX = sys.platform.startswith("linux")


def socket_address(channel: str) -> str:
    """Abstract-namespace address on Linux (nothing to clean up), a temp path elsewhere."""
    if _LINUX:
        return "\0podrace-sync-" + channel
    return os.path.join(tempfile.gettempdir(), f"podrace-sync-{channel}.sock")


MAX_SOCKET_ADDRESS = 108 if _LINUX else 107
"""Bytes of a Unix socket address: sun_path's 108, an abstract name's leading NUL included;
a path needs its final NUL."""

_live: weakref.WeakSet[Doorbell | DoorbellClient] = weakref.WeakSet()  # this process's sockets


def _close_inherited() -> None:
    for obj in list(_live):
        obj._close_in_fork_child()
    _live.clear()


os.register_at_fork(after_in_child=_close_inherited)


class _Client:
    __slots__ = ("sock", "buf", "name")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.name: str | None = None


class Doorbell:
    """Publisher side: accepts subscribers, rings them, collects their acks."""

    def __init__(self, channel: str) -> None:
        self._address = socket_address(channel)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self._address)
        self._listener.listen(256)
        self._listener.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._lock = threading.Lock()
        self._clients: dict[socket.socket, _Client] = {}
        self._acks: dict[str, int] = {}
        self._closed = False
        self._thread = threading.Thread(
            target=self._serve, name=f"podrace-doorbell-{channel}", daemon=True
        )
        _live.add(self)
        self._thread.start()

    def ring(self, version: int) -> None:
        """Wake every subscriber; never blocks."""
        msg = b"%d\n" % version
        with self._lock:
            clients = list(self._clients)
        for sock in clients:
            try:
                sock.send(msg, socket.MSG_DONTWAIT)
            except OSError:
                pass  # full: wake-ups already pending there; broken: the server thread drops it

    def acks(self) -> dict[str, int]:
        with self._lock:
            return dict(self._acks)

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ, "accept")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            while not self._closed:
                for key, _ in sel.select():
                    if key.data == "wake":
                        return
                    if key.data == "accept":
                        self._accept(sel)
                    else:
                        self._receive(sel, key.fileobj)  # type: ignore[arg-type]
        finally:
            sel.close()

    def _accept(self, sel: selectors.BaseSelector) -> None:
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        sock.setblocking(False)
        with self._lock:
            self._clients[sock] = _Client(sock)
        sel.register(sock, selectors.EVENT_READ, "client")
        try:  # a ring that raced with this accept was not sent here: wake it once now
            sock.send(b"0\n", socket.MSG_DONTWAIT)
        except OSError:
            return  # best effort: a full or closed socket is handled by the read side

    def _receive(self, sel: selectors.BaseSelector, sock: socket.socket) -> None:
        try:
            data = sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            sel.unregister(sock)
            self._drop(sock)
            return
        with self._lock:
            client = self._clients.get(sock)
            if client is None:
                return
            client.buf += data
            *lines, client.buf = client.buf.split(b"\n")
            for line in lines:
                kind, _, arg = line.decode("utf-8", "replace").partition(" ")
                if kind == "hello":
                    client.name = self._unique(arg)
                    self._acks[client.name] = -1
                elif kind == "ack" and client.name is not None and arg.lstrip("-").isdigit():
                    self._acks[client.name] = max(self._acks.get(client.name, -1), int(arg))

    def _unique(self, name: str) -> str:
        """`name`, or `name#2`, `name#3`... if a connected subscriber has it: copies of a
        subscriber (pickled, forked) keep its name, but each reports and leaves alone."""
        key, n = name, 1
        while key in self._acks:
            n += 1
            key = f"{name}#{n}"
        return key

    def _drop(self, sock: socket.socket) -> None:
        with self._lock:
            client = self._clients.pop(sock, None)
            if client is not None and client.name is not None:
                self._acks.pop(client.name, None)  # gone: stop reporting it
        try:
            sock.close()
        except OSError:
            return  # already closed by the peer going away: nothing left to release

    def _close_in_fork_child(self) -> None:
        # no server thread here, and no lock is taken: one may have been held at the fork
        self._closed = True
        for sock in [*self._clients, self._listener, self._wake_r, self._wake_w]:
            sock.close()

    def close(self) -> None:
        """Disconnect everyone: their listeners see end-of-file."""
        if self._closed:
            return
        self._closed = True
        self._wake_w.send(b"x")
        self._thread.join(5)
        with self._lock:
            socks = list(self._clients)
        for sock in socks:
            self._drop(sock)
        for s in (self._listener, self._wake_r, self._wake_w):
            s.close()
        if not _LINUX:
            try:
                os.unlink(self._address)
            except FileNotFoundError:
                return  # already removed: the goal of this call holds


class DoorbellClient:
    """Subscriber side: a thread that turns doorbell bytes into `on_ring()` calls."""

    def __init__(
        self, channel: str, name: str, on_ring: Callable[[], None], on_gone: Callable[[], None]
    ):
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(socket_address(channel))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            self._sock.close()
            raise ConnectionError(f"no publisher listening on channel {channel!r}") from exc
        self._on_ring = on_ring
        self._on_gone = on_gone
        self._send_lock = threading.Lock()
        self._send(f"hello {name}\n".encode())
        _live.add(self)
        self._thread = threading.Thread(
            target=self._listen, name=f"podrace-doorbell-client-{name}", daemon=True
        )
        self._thread.start()

    def _listen(self) -> None:
        while True:
            try:
                data = self._sock.recv(4096)
            except OSError:
                data = b""
            if not data:
                self._on_gone()
                return
            self._on_ring()

    def _send(self, msg: bytes) -> None:
        with self._send_lock:
            try:
                self._sock.send(msg, socket.MSG_DONTWAIT)
            except OSError:
                pass  # best effort: acknowledgements are metrics only

    def ack(self, version: int) -> None:
        self._send(b"ack %d\n" % version)

    def _close_in_fork_child(self) -> None:
        self._sock.close()  # the listener thread is not here: nothing to wake

    def close(self) -> None:
        with contextlib.suppress(OSError):  # already disconnected (or closed in a fork child)
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the listener thread
        if threading.current_thread() is not self._thread:  # a finalizer may run on it
            self._thread.join(5)
        self._sock.close()
