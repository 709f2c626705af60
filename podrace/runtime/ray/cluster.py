"""Start, join and leave a Ray cluster for one run; Ray is imported only here and below.

Without an address podrace starts a private local Ray for the run: a fresh temp dir (so it
never joins or stops anyone else's Ray on the machine), node address 127.0.0.1, no
dashboard and no job server, Ray's token authentication left as Ray sets it (on), and
everything it started is stopped at the end. With an address it joins that cluster and
leaves it running. Ray's own SIGTERM handler is taken back so that the CLI's clean stop
keeps working. What Ray prints for the driver goes to the run directory unless
`--ray.log-to-console` (`podrace.runtime.ray.messages`). The local Ray's processes are
found and stopped by `podrace.runtime.ray.processes`; `python -m podrace.runtime.ray.cluster
stop TEMP_DIR` stops a Ray started by hand with `ray start --temp-dir TEMP_DIR`.
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
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from podrace.config import ConfigError, RayConfig
from podrace.envs.sending import Destination, check_sendable
from podrace.envs.source import EnvSource
from podrace.runtime.ray.messages import RayMessages, messages_to
from podrace.runtime.ray.processes import (
    TEMP_PREFIX,
    process_tree,
    reap,
    stop_ray,
    sweep_orphans,
    write_owner,
)
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
    check_sendable(envs, Destination("Ray workers", "use --runtime threads", ray.cloudpickle))


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
            write_owner(temp_dir)
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


def worker_capacity(ray: Any, cfg: RayConfig) -> dict[str, int]:
    """node id -> how many workers the node holds, empty (one CPU and the worker resources
    each), for every alive node that holds at least one."""
    each = {"CPU": 1.0, **worker_resources(cfg)}
    out = {}
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        have = node.get("Resources", {})
        fits = min(int(have.get(k, 0) / v + 1e-9) for k, v in each.items())
        if fits > 0:
            out[node["NodeID"]] = fits
    return out


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
    fits = sum(worker_capacity(ray, cfg).values())
    wanted = 1 if cfg.data_order == "elastic" else cfg.num_workers
    if fits < wanted:
        workers = "no worker" if wanted == 1 else f"{fits} of the {wanted} workers"
        raise ConfigError(
            f"the Ray cluster can hold {workers}: each takes {each} "
            "and its nodes offer "
            + "; ".join(", ".join(f"{k} {n['Resources'].get(k, 0):g}" for k in each) for n in nodes)
            + "; lower --ray.num-workers or add nodes"
        )


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
