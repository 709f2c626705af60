"""Start, join and leave a Ray cluster for one run; Ray is imported only here and below.

Without an address podrace starts a private local Ray for the run: a fresh temp dir (so it
never joins or stops anyone else's Ray on the machine), node address 127.0.0.1, no
dashboard and no job server, Ray's token authentication left as Ray sets it (on), and
everything it started is stopped at the end. With an address it joins that cluster and
leaves it running. Ray's own SIGTERM handler is taken back so that the CLI's clean stop
keeps working. What Ray prints for the driver goes to the run directory unless
`--ray.log-to-console` (`podrace.runtime.ray.messages`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from podrace.config import ConfigError, RayConfig
from podrace.envs.source import EnvSource
from podrace.envs.workers import check_sendable
from podrace.runtime.ray.messages import RayMessages, messages_to
from podrace.validation import worker_resources

log = logging.getLogger(__name__)


def import_ray() -> Any:
    """The `ray` module, or a ConfigError saying how to install it.

    Ray's auto-connect is turned off when podrace is the first to import it: podrace starts
    or joins Ray itself, and a late call from a straggling thread after `ray.shutdown()`
    must fail, not start a second local Ray that nobody stops."""
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    try:
        import ray
    except ImportError:
        raise ConfigError("--runtime ray needs Ray: pip install 'podrace[ray]'") from None
    return ray


def check_auth_not_disabled() -> None:
    """podrace never runs Ray with token authentication turned off."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        raise ConfigError(
            "RAY_AUTH_MODE=disabled: podrace keeps Ray's token authentication on; unset it "
            "(and see docs/guides/ray.md for clusters started with `ray start`)"
        )


def check_envs_sendable(envs: EnvSource) -> None:
    """ConfigError (before Ray starts) unless a caller's env factory pickles as Ray sends
    it to its workers (Ray's cloudpickle)."""
    ray = import_ray()
    check_sendable(envs, "Ray workers", "use --runtime threads", pickler=ray.cloudpickle)


@dataclass(frozen=True)
class Cluster:
    """The Ray a run uses: `local` when podrace started it (and will stop it)."""

    address: str
    local: bool
    temp_dir: str | None
    """Private temp dir of a local Ray (its session, sockets and logs), else None."""
    messages: RayMessages
    """Where Ray's messages to the driver go (`attach` the run directory once it exists)."""


QUIETED = {
    "ray._private.worker": "SIGTERM handler",  # podrace handles signals itself
    # podrace keeps token authentication on and refuses RAY_AUTH_MODE=disabled
    "ray._private.authentication.authentication_token_setup": "RAY_AUTH_MODE=disabled to opt out",
}
"""Ray's loggers -> a part of the one message of each that `ray.init` is kept from printing."""


def _quieted(text: str) -> Callable[[logging.LogRecord], bool]:
    return lambda record: text not in record.getMessage()


def _quiet_init(ray: Any, log_to_driver: bool, **kwargs: Any) -> None:
    filters = [(logging.getLogger(name), _quieted(text)) for name, text in QUIETED.items()]
    for logger, keep in filters:
        logger.addFilter(keep)
    try:
        with (
            warnings.catch_warnings()
        ):  # Ray starts its daemons with fork_exec; JAX warns about forks
            warnings.filterwarnings("ignore", message=".*os.fork.*")
            ray.init(log_to_driver=log_to_driver, configure_logging=False, **kwargs)
    finally:
        for logger, keep in filters:
            logger.removeFilter(keep)


@contextlib.contextmanager
def connect(cfg: RayConfig, num_cpus: int) -> Iterator[Cluster]:
    """Start (no address) or join Ray for the body of the `with`; stop or leave it after.

    `num_cpus` is what a local Ray advertises (at least one per worker). Raises ConfigError
    when Ray is missing, auth is disabled, the address cannot be reached, or no node offers
    the workers' custom resources.
    """
    ray = import_ray()
    check_auth_not_disabled()
    if ray.is_initialized():
        raise ConfigError(
            "Ray is already initialized in this process; podrace starts or joins Ray itself"
        )
    term_handler = signal.getsignal(signal.SIGTERM)
    temp_dir = None
    messages = RayMessages()
    quiet = contextlib.ExitStack()
    try:
        if not cfg.log_to_console:
            quiet.enter_context(messages_to(messages))
        if cfg.address is None:
            sweep_orphans()
            # Private (never shared with another Ray); keep TMPDIR short: Ray's unix sockets
            # live under it and socket paths are limited to 107 bytes.
            temp_dir = tempfile.mkdtemp(prefix=TEMP_PREFIX)
            _write_owner(temp_dir)
            _quiet_init(
                ray,
                cfg.log_to_console,
                address="local",
                num_cpus=num_cpus,
                _node_ip_address="127.0.0.1",
                include_dashboard=False,
                _temp_dir=temp_dir,
                # Ray runs workers at nice 15 by default, as background work; here they are
                # the run's actors, and on a busy machine nice 15 made them ~4x slower.
                _system_config={"worker_niceness": 0},
            )
        else:
            _check_reachable(cfg.address, min(cfg.start_timeout_s, 10.0))
            try:
                _quiet_init(ray, cfg.log_to_console, address=cfg.address)
            except (ConnectionError, RuntimeError, ValueError) as error:
                first = (
                    str(error).strip().splitlines()[0]
                    if str(error).strip()
                    else type(error).__name__
                )
                # Ray reports a refused token only as "Failed to connect", after ~30 s of retries
                hint = (
                    "; is RAY_AUTH_TOKEN the cluster's token?"
                    if os.environ.get("RAY_AUTH_TOKEN")
                    else "; a cluster with token authentication needs RAY_AUTH_MODE=token and "
                    "its RAY_AUTH_TOKEN here"
                )
                raise ConfigError(
                    f"cannot join the Ray cluster at {cfg.address}: {first}{hint}"
                ) from None
        if threading_main():
            signal.signal(signal.SIGTERM, term_handler)
        cluster = Cluster(
            address=ray.get_runtime_context().gcs_address,
            local=cfg.address is None,
            temp_dir=temp_dir,
            messages=messages,
        )
        _check_resources(ray, cfg)
        yield cluster
    finally:
        processes = process_tree(temp_dir) if temp_dir is not None else {}
        if ray.is_initialized():
            ray.shutdown()
        quiet.close()  # after the shutdown, which ends Ray's thread that prints them
        if threading_main():
            signal.signal(signal.SIGTERM, term_handler)
        if temp_dir is not None:
            reap(processes)
            try:
                if not cfg.log_to_console:
                    messages.keep_logs(temp_dir)
            except OSError as error:
                log.warning("Ray's logs not kept in the run directory: %s", error)
            finally:
                shutil.rmtree(temp_dir, ignore_errors=True)


TEMP_PREFIX = "podrace-ray-"
_OWNER = "owner"


def _write_owner(temp_dir: str) -> None:
    """Record which process owns this local Ray (pid and start time, so a reused pid is
    not mistaken for the owner)."""
    st = _stat(os.getpid())
    with open(os.path.join(temp_dir, _OWNER), "w") as f:
        f.write(f"{os.getpid()} {st[1] if st else 0}\n")


def _owner_alive(temp_dir: str) -> bool | None:
    """Whether the process that started the local Ray in `temp_dir` still runs (None: no
    readable owner record, e.g. the owner is still writing it)."""
    try:
        with open(os.path.join(temp_dir, _OWNER)) as f:
            pid, start = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        return None
    return bool(alive({pid: start}))


def sweep_orphans() -> list[str]:
    """Stop and remove the local Rays of podrace runs whose owner is gone (a driver killed
    with SIGKILL cannot stop its Ray: its daemons and workers would run on, holding CPUs
    and memory). Only this user's `podrace-ray-*` temp dirs with a dead owner are touched;
    returns the dirs removed."""
    removed = []
    root = tempfile.gettempdir()
    for name in sorted(os.listdir(root)):
        temp_dir = os.path.join(root, name)
        if not name.startswith(TEMP_PREFIX) or _owner_alive(temp_dir) is not False:
            continue
        with contextlib.suppress(OSError):
            if os.stat(temp_dir).st_uid != os.getuid():
                continue
        processes = process_tree(temp_dir)
        for pid in alive(processes):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        reap(processes, grace_s=5.0)
        shutil.rmtree(temp_dir, ignore_errors=True)
        removed.append(temp_dir)
    return removed


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""HTTP/2's client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS) answers
with a SETTINGS frame of its own."""


def _check_reachable(address: str, timeout_s: float) -> None:
    """ConfigError unless a gRPC server (as Ray's head is) answers at HOST:PORT: ray.init
    keeps retrying an unreachable head, or a port where something else listens, for
    minutes, which looked like a hang. Without TLS only (RAY_USE_TLS: Ray speaks TLS first)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as sock:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return
            sock.sendall(HTTP2_PREFACE)
            header = b""
            while len(header) < 9:
                chunk = sock.recv(9 - len(header))
                if not chunk:
                    break
                header += chunk
    except TimeoutError:
        header = b""
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise ConfigError(
            f"cannot join the Ray cluster at {address}: nothing answers there ({reason})"
        ) from None
    if len(header) < 9 or header[3] != 4:  # frame type 4: SETTINGS
        raise ConfigError(
            f"cannot join the Ray cluster at {address}: something listens there but it is not "
            f"a Ray head (no gRPC answer within {timeout_s:g}s); is the port the head's GCS port "
            "(6379)?"
        )


def threading_main() -> bool:
    return threading.current_thread() is threading.main_thread()


def local_cpus(cfg: RayConfig) -> int:
    """CPUs a private local Ray advertises: one per worker (`auto`: the machine's cores,
    or --ray.max-workers)."""
    if cfg.num_workers != "auto":
        return cfg.num_workers
    return cfg.max_workers or os.cpu_count() or 1


def _check_resources(ray: Any, cfg: RayConfig) -> None:
    """ConfigError unless the cluster's nodes, empty, could hold every worker at once (one
    CPU each and its custom resources; the elastic order: one worker, the others wait for
    resources): otherwise the run would wait out `ray.start_timeout_s` for workers Ray can
    never place."""
    needed = worker_resources(cfg)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if needed and not any(
        all(n["Resources"].get(k, 0) >= v for k, v in needed.items()) for n in nodes
    ):
        offered = sorted({k for n in nodes for k in n["Resources"] if not k.startswith("node:")})
        raise ConfigError(
            f"no Ray node offers the worker resources {needed} "
            f"(resources in the cluster: {offered}); "
            "start actor nodes with `ray start --address ... --resources '{\"NAME\": N}'`"
        )
    each = {"CPU": 1.0, **needed}
    fits = sum(
        min(int(n["Resources"].get(k, 0) / v + 1e-9) for k, v in each.items()) for n in nodes
    )
    wanted = 1 if cfg.data_order == "elastic" else cfg.num_workers
    if fits < wanted:
        workers = "no worker" if wanted == 1 else f"{fits} of the {wanted} workers"
        raise ConfigError(
            f"the Ray cluster can hold {workers}: each takes {each} "
            "and its nodes offer "
            + "; ".join(", ".join(f"{k} {n['Resources'].get(k, 0):g}" for k in each) for n in nodes)
            + "; lower --ray.num-workers or add nodes"
        )


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, start time, uid) of `pid`, None if it is gone (or a zombie: it has exited, and
    a container's init may never reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            return None
        return int(fields[1]), int(fields[19]), os.stat(f"/proc/{pid}").st_uid
    except (OSError, IndexError, ValueError):
        return None


def process_tree(temp_dir: str) -> dict[int, int]:
    """{pid: start time} of this user's processes that use `temp_dir` (a local Ray's
    daemons and agents, see `_uses`) and of all their descendants (its workers, which
    rename themselves `ray::...`)."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None and st[2] == os.getuid():
            stats[int(entry)] = st
    roots = {pid for pid in stats if pid != os.getpid() and _uses(pid, temp_dir)}
    tree, frontier = set(roots), set(roots)
    while frontier:
        frontier = {pid for pid, st in stats.items() if st[0] in frontier and pid not in tree}
        tree |= frontier
    return {pid: stats[pid][1] for pid in tree}


def _uses(pid: int, temp_dir: str) -> bool:
    """`temp_dir` is on the command line of `pid` or it has a file open inside it (Ray's
    agents rename themselves `ray::...` but keep their logs there, and outlive a killed
    raylet as orphans)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        if not _is_ray(cmdline, temp_dir):
            return False  # a user's `tail -f` of its logs, a script given the path: not Ray's
        if temp_dir.encode() in cmdline:
            return True
        inside = temp_dir.rstrip("/") + "/"
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(inside):
                    return True
    except OSError:  # the process ended while we looked
        pass
    return False


def _is_ray(cmdline: bytes, temp_dir: str) -> bool:
    """A Ray process by its command line: `ray` in an argument other than the ones naming
    `temp_dir` (raylet, gcs_server and Ray's Python scripts live under a `ray/` folder,
    workers and agents rename themselves `ray::...`)."""
    path = temp_dir.rstrip("/").encode()
    return any(b"ray" in arg for arg in cmdline.split(b"\0") if path not in arg)


def alive(processes: dict[int, int]) -> list[int]:
    """The pids of `processes` ({pid: start time}) still running (pid reuse excluded)."""
    return [
        pid for pid, start in processes.items() if (st := _stat(pid)) is not None and st[1] == start
    ]


def reap(processes: dict[int, int], grace_s: float = 10.0) -> None:
    """Wait for `processes` to exit, then SIGKILL the stragglers.

    `ray.shutdown()` stops a local Ray already; this makes "nothing left running" a
    guarantee. Only the processes of this run's private local Ray are touched.
    """
    deadline = time.monotonic() + grace_s
    while (left := alive(processes)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def stop_ray(temp_dir: str, grace_s: float = 10.0) -> list[int]:
    """Stop the Ray whose `--temp-dir` is `temp_dir` on this machine: this user's processes
    that use it and their children, SIGTERM then (after `grace_s`) SIGKILL; returns their
    pids. Other Rays of the machine are never touched (Ray 2.60's `ray stop` stops all)."""
    processes = process_tree(os.path.abspath(temp_dir))
    for pid in alive(processes):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    reap(processes, grace_s=grace_s)
    deadline = time.monotonic() + 5.0  # those just SIGKILLed take a moment to go
    while alive(processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    return sorted(processes)


def main(argv: list[str]) -> int:
    """`python -m podrace.runtime.ray.cluster stop TEMP_DIR`: stop a Ray you started with
    `ray start --temp-dir TEMP_DIR`, by its processes' ids."""
    if len(argv) != 2 or argv[0] != "stop":
        print("usage: python -m podrace.runtime.ray.cluster stop TEMP_DIR", file=sys.stderr)
        return 2
    if not os.path.isdir(argv[1]):
        print(f"error: no folder {argv[1]!r} (the --temp-dir given to ray start)", file=sys.stderr)
        return 2
    stopped = stop_ray(argv[1])
    print(
        f"stopped {len(stopped)} process(es) of the Ray in {argv[1]}: {stopped}"
        if stopped
        else f"no process of this user uses {argv[1]}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
