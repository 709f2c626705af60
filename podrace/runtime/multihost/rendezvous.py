"""Before jax.distributed starts: every process reaches process 0 over plain TCP, on the
coordinator's port, so a process that never started, a wrong coordinator address or
processes that disagree on the process count are one-line ConfigErrors (exit 2).

jax.distributed cannot say so: when a process is missing at its deadline, its client ends
the whole process with a C++ fatal error (exit 134, a stack trace). Process 0 closes its
listener before JAX's service binds the same port; the other processes close their ends
first, so no connection lingers on process 0's side of that port.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable

from podrace.config import ConfigError

HELLO = "podrace-rendezvous/1"
POLL_S = 0.2
"""How often a process retries reaching process 0 while it is not listening yet."""
CLOSE_WAIT_S = 2.0
"""How long process 0 waits for the others to close their connections after its answer."""


def host_of(address: str) -> str:
    """The host part of HOST:PORT (an IPv6 host without its brackets)."""
    host = address.rpartition(":")[0]
    return host.strip("[]")


def rendezvous(
    coordinator: str,
    num_processes: int,
    process_id: int,
    timeout_s: float,
    check: Callable[[], None] = lambda: None,
    offer: dict | None = None,
) -> dict:
    """Return once every process has reached process 0 and agrees on `num_processes`;
    ConfigError otherwise, on every process that is there, within about `timeout_s`.
    `check` is called every POLL_S while waiting (a stop raises from it: Ctrl-C).
    Process 0's `offer` (JSON fields) is returned on every process."""
    offer = dict(offer or {})
    if num_processes <= 1:
        return offer
    host, _, port = coordinator.rpartition(":")
    if process_id == 0:
        _gather(int(port), num_processes, timeout_s, check, offer)
        return offer
    answer = _report(host.strip("[]"), int(port), num_processes, process_id, timeout_s, check)
    return {key: value for key, value in answer.items() if key != "ok"}


def listen_on_all_addresses(port: int, backlog: int | None = None) -> socket.socket:
    """A listening socket on every IPv4 and (where the host has it) IPv6 address: the
    others reach process 0 by whatever the coordinator names (127.0.0.1, [::1], a name)."""
    if socket.has_dualstack_ipv6():
        return socket.create_server(
            ("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=backlog
        )
    return socket.create_server(("", port), backlog=backlog)


def _listen(port: int) -> socket.socket:
    try:
        return listen_on_all_addresses(port)
    except OSError as error:
        from podrace.runtime.multihost.coordination_service import LINGER_S

        raise ConfigError(
            f"distributed: process 0 cannot listen on port {port} of the coordinator: "
            f"{error.strerror or error} (another run on it? a process 0 killed or ended "
            f"abruptly keeps it for {LINGER_S:g}s)"
        ) from None


def _gather(
    port: int, num_processes: int, timeout_s: float, check: Callable[[], None], offer: dict
) -> None:
    """Process 0: accept every other process's hello, then answer all of them at once."""
    deadline = time.monotonic() + timeout_s
    server = _listen(port)
    joined: dict[int, socket.socket] = {}
    others: list[socket.socket] = []  # connections that said nothing usable
    error = None
    refused = (
        None  # the first process that said it cannot run (`refuse`): told to everyone at the end
    )
    try:
        while error is None and len(joined) < num_processes - 1:
            check()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(1, num_processes)) - set(joined))
                error = (
                    f"distributed: process(es) {missing} did not join within {timeout_s:g}s "
                    f"(started, with --distributed.coordinator naming process 0's HOST:PORT?)"
                )
                break
            server.settimeout(min(POLL_S, remaining))
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            hello = _read(conn, min(5.0, max(0.01, deadline - time.monotonic())), check) or {}
            process = hello.get("process") if hello.get("hello") == HELLO else None
            if not isinstance(process, int) or isinstance(process, bool):
                others.append(conn)  # not a podrace process (a port scanner, a stray client)
            elif hello.get("num_processes") != num_processes:
                joined.setdefault(process, conn)
                error = (
                    f"distributed: processes disagree on --distributed.num-processes: "
                    f"process 0 says {num_processes}, "
                    f"process {process} says {hello.get('num_processes')}"
                )
            elif not 0 < process < num_processes:
                others.append(conn)
                error = f"distributed: a process says it is process {process} of {num_processes}"
            elif process in joined and isinstance(
                hello.get("refusal"), str
            ):  # stopped since its hello
                others.append(conn)
                refused = (
                    refused or f"distributed: process {process} cannot run: {hello['refusal']}"
                )
            elif process in joined:
                others.append(conn)
                error = f"distributed: two processes say they are process {process}"
            else:
                joined[process] = conn
                if isinstance(hello.get("refusal"), str) and refused is None:
                    refused = f"distributed: process {process} cannot run: {hello['refusal']}"
        error = error or refused
        if (
            error is None
        ):  # one that gave up (or was killed) since its hello would leave JAX a process short
            gone = sorted(p for p, conn in joined.items() if _closed(conn))
            if gone:
                error = f"distributed: process(es) {gone} left before every process had joined"
        answer = {**offer, "ok": True} if error is None else {"error": error}
        for conn in joined.values():
            send_line(conn, answer)
        for conn in others:
            send_line(conn, {"error": error or "distributed: not a process of this run"})
        _wait_closed(list(joined.values()) + others)
    finally:
        server.close()
    if error is not None:
        raise ConfigError(error)


def _report(
    host: str,
    port: int,
    num_processes: int,
    process_id: int,
    timeout_s: float,
    check: Callable[[], None],
) -> dict:
    """Process i > 0: reach process 0 (retrying until it listens), say hello, await the answer."""
    deadline = time.monotonic() + timeout_s
    where = f"{host}:{port}"
    while True:
        check()
        try:
            conn = socket.create_connection(
                (host, port), timeout=max(0.01, min(POLL_S * 5, deadline - time.monotonic()))
            )
            break
        except OSError:
            if time.monotonic() >= deadline:
                raise ConfigError(
                    f"distributed: process 0 at {where} did not answer within {timeout_s:g}s "
                    f"(is it started, and is {where} its address from this host?)"
                ) from None
            time.sleep(POLL_S)
    with conn:
        send_line(conn, {"hello": HELLO, "process": process_id, "num_processes": num_processes})
        # Process 0 was listening when this connected: it answers within its own timeout.
        answer = _read(conn, timeout_s + CLOSE_WAIT_S, check)
    if answer is None:
        raise ConfigError(f"distributed: process 0 at {where} gave no answer within {timeout_s:g}s")
    if answer.get("ok") is True:
        return answer
    if isinstance(answer.get("error"), str):
        raise ConfigError(answer["error"])
    raise ConfigError(
        f"distributed: process 0 at {where} ended the meeting without an answer (it stopped: "
        f"see its error; or it had met a process {process_id} already; or {where} is not a "
        f"podrace process 0)"
    )


def refuse(
    coordinator: str, num_processes: int, process_id: int, reason: str, timeout_s: float
) -> None:
    """Process i > 0 whose own config is invalid (so it will not join): tell process 0's
    meeting, which then refuses the run on every process, instead of leaving them to wait
    out the init timeout for it. Best effort, for at most `timeout_s`."""
    if process_id <= 0 or num_processes <= 1:
        return
    host, _, port = coordinator.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(
                (host.strip("[]"), int(port)), timeout=POLL_S * 5
            ) as conn:
                send_line(
                    conn,
                    {
                        "hello": HELLO,
                        "process": process_id,
                        "num_processes": num_processes,
                        "refusal": reason,
                    },
                )
                return
        except (OSError, ValueError):
            time.sleep(POLL_S)


def send_line(conn: socket.socket, message: dict) -> None:
    """One JSON line; a peer that is gone is not an error here: the reading side sees it
    (EOF) and reports it (the meeting's answer, the peer link's loss)."""
    try:
        conn.sendall((json.dumps(message) + "\n").encode())
    except OSError:
        pass  # see the docstring: the reader reports the loss


def _read(conn: socket.socket, timeout_s: float, check: Callable[[], None]) -> dict | None:
    """One JSON line; {} if the peer closed or sent something else, None if it took too long."""
    deadline = time.monotonic() + timeout_s
    data = b""
    while b"\n" not in data and len(data) < 4096:
        check()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        conn.settimeout(min(POLL_S, remaining))
        try:
            chunk = conn.recv(4096)
        except TimeoutError:
            continue
        except OSError:
            return {}
        if not chunk:
            break
        data += chunk
    try:
        message = json.loads(data.split(b"\n", 1)[0])
    except ValueError:
        return {}
    return message if isinstance(message, dict) else {}


def _closed(conn: socket.socket) -> bool:
    """The other side closed (or reset) this connection: it says nothing after its hello."""
    try:
        conn.setblocking(False)
        return conn.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        conn.setblocking(True)


def _wait_closed(conns: list[socket.socket]) -> None:
    """Let the other side close first (so the port JAX binds next has no connection of
    process 0's lingering on it), then close ours."""
    deadline = time.monotonic() + CLOSE_WAIT_S
    for conn in conns:
        try:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            while conn.recv(4096):
                pass
        except OSError:
            pass  # not closed in time, or reset: ours is closed below all the same
        finally:
            conn.close()


__all__ = ["host_of", "listen_on_all_addresses", "rendezvous", "send_line"]
