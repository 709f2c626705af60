"""Joining a multi-process run: jax.distributed, one agreed config, the global learner mesh.

Every process runs the same command. `meet` gathers them over plain TCP before JAX does
(and hands out the peer link's address), `join` starts jax.distributed (gloo collectives on
CPU). `agree` then makes every process check itself (devices, env ids, sizes) and post
either its resolved config or its one-line error to the coordinator's key-value store;
each process reads every other post, so one process's bad layout, or configs that differ,
stop *every* process with a ConfigError before any thread starts or anything is written.

Layout device ids index each process's *local* devices. The global learner mesh is every
process's learner devices, process by process; each process feeds only its own shards.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import secrets
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

from podrace.config import ConfigError, DistributedConfig, TrainConfig, replace
from podrace.runtime.multihost.coordination_service import hosted_service, stop_hosted_service
from podrace.runtime.multihost.rendezvous import host_of, refuse, rendezvous

log = logging.getLogger(__name__)

_CONFIG_KEY = "podrace/config/{}"
_SHARED_KEY = "podrace/shared/{}"
_COUNTERS_KEY = "podrace/counters/{}/{}"
"""Process i's counters for the save of a version, for process 0 to put in the meta."""
SHUTDOWN_TIMEOUT_S = 600
# Fields allowed to differ between processes: which process this is, and how it reaches
# the coordinator; the run directory's name is process 0's.
_PER_PROCESS = ("distributed.process_id", "distributed.coordinator", "log.run_name")


class RunRefused(ConfigError):
    """A ConfigError raised on every process alike (each saw the same posts), so all of
    them can leave jax.distributed together."""


@dataclass(frozen=True)
class Cluster:
    """This process's place in a joined run."""

    process_id: int
    num_processes: int
    coordinator: str
    """HOST:PORT of process 0 (reachable from every process)."""
    store: Any
    """jax.distributed's client: a key-value store shared by all processes."""
    timeout_s: float

    def get(self, key: str) -> str:
        """Blocking read of a key another process sets; ConfigError after the join timeout."""
        try:
            return self.store.blocking_key_value_get(key, int(self.timeout_s * 1000))
        except Exception as error:  # noqa: BLE001 - jaxlib raises its own runtime error type
            raise ConfigError(
                f"process {self.process_id}: no answer for '{key}' within {self.timeout_s:g}s: "
                f"{str(error).splitlines()[0]}"
            ) from None


def meet(
    d: DistributedConfig, check: Callable[[], None] = lambda: None
) -> socket.socket | str | None:
    """Before jax.distributed: where the flags give the process count and id (the
    coordinator from its flag or JAX_COORDINATOR_ADDRESS), the processes meet over plain TCP
    (`rendezvous`; jax.distributed would abort a process, not raise, when one is missing),
    and process 0 hands out its peer link's port. Returns the link's hub for
    `PeerLink.open` (process 0's listening socket there, its HOST:PORT elsewhere), so the
    link is up before jax.distributed starts; None where JAX must detect the processes
    (SLURM, Open MPI, ...: the link then opens through JAX's store). `check` is called while
    waiting (a stop raises from it: Ctrl-C)."""
    known = _explicit(d)
    if known is None:
        return None
    coordinator, num_processes, process_id = known
    if process_id != 0:
        try:
            offer = rendezvous(*known, float(d.init_timeout_s), check)
        except ConfigError:
            raise
        except BaseException as stop:  # a stop (Ctrl-C) while waiting: the meeting hears of it
            refuse(
                *known,
                f"it was stopped before every process had joined ({stop})",
                STOP_REFUSAL_WAIT_S,
            )
            raise
        port = offer.get("peers")
        if not isinstance(port, int) or isinstance(port, bool):
            raise ConfigError(
                f"distributed: process 0 at {coordinator} offered no peer link "
                "(another podrace version?)"
            )
        host = host_of(coordinator)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # IPv6 in brackets
    from podrace.runtime.multihost.peers import PeerLink

    hub = PeerLink.listen(num_processes)
    try:
        rendezvous(*known, float(d.init_timeout_s), check, offer={"peers": hub.getsockname()[1]})
    except BaseException:
        hub.close()
        raise
    return hub


def join(d: DistributedConfig) -> Cluster:
    """Start jax.distributed (after `meet`); unset fields come from JAX (env vars, cluster
    detection)."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # JAX's preemption notifier takes SIGTERM's handler for itself (it only logs "SIGTERM
    # caught" and lets the run go on); podrace stops on SIGTERM and uses no sync points.
    jax.config.update("jax_enable_preemption_service", False)
    try:
        with hosted_service():  # process 0's coordination service outlives a killed process 0
            jax.distributed.initialize(
                coordinator_address=d.coordinator,
                num_processes=d.num_processes,
                process_id=d.process_id,
                initialization_timeout=d.init_timeout_s,
                # The peer link notices a lost process and exits with a clear line; JAX's
                # heartbeat (which aborts the process) is only the last resort.
                heartbeat_timeout_seconds=int(max(100, 3 * d.peer_timeout_s)),
                # A finished process waits this long at the shutdown barrier for the others
                # (process 0 may still be running its final evaluation).
                shutdown_timeout_seconds=SHUTDOWN_TIMEOUT_S,
            )
    except (ValueError, TypeError) as error:
        hint = (
            " (pass --distributed.num-processes and --distributed.process-id, or run where JAX "
            "detects them: SLURM, Open MPI, Kubernetes, TPU pods)"
            if d.num_processes is None
            else ""
        )
        raise ConfigError(f"distributed: {str(error).splitlines()[0]}{hint}") from None
    except Exception as error:  # noqa: BLE001 - e.g. the coordinator never answered
        raise ConfigError(
            f"distributed: could not join the run: {str(error).splitlines()[0]}"
        ) from None
    from jax._src.distributed import global_state  # the only handle on the key-value store

    coordinator = d.coordinator or global_state.coordinator_address
    return Cluster(
        jax.process_index(),
        jax.process_count(),
        coordinator,
        global_state.client,
        float(d.init_timeout_s),
    )


def refuse_to_join(d: DistributedConfig, reason: str) -> None:
    """This process's config is invalid: tell the meeting of the others (see
    `rendezvous.refuse`)."""
    known = _explicit(d)
    if known is not None:
        refuse(*known, reason, min(float(d.init_timeout_s), REFUSAL_WAIT_S))


REFUSAL_WAIT_S = 10.0
"""How long an invalid process tries to reach process 0's meeting to say so."""
STOP_REFUSAL_WAIT_S = 1.0
"""The same for a process stopped while it waits for the meeting (it is leaving)."""


def _explicit(d: DistributedConfig) -> tuple[str, int, int] | None:
    """(coordinator, num_processes, process_id) when the flags give the count and id (the
    coordinator from its flag or JAX_COORDINATOR_ADDRESS, as JAX reads it); None when JAX
    must detect them (SLURM, Open MPI, ...), or when the id is outside the run (no process
    of the run waits for it: its error is enough)."""
    coordinator = d.coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS")
    if d.num_processes is None or d.process_id is None or not coordinator:
        return None
    if not 0 <= d.process_id < d.num_processes:
        return None
    if not re.fullmatch(r"[0-9]{1,5}", coordinator.rpartition(":")[2]):
        return None  # left to JAX, which names what is wrong
    return coordinator, d.num_processes, d.process_id


def resolved(cfg: TrainConfig, cluster: Cluster) -> TrainConfig:
    """`cfg` with the process count and id JAX settled on (they may come from the environment)."""
    return replace(
        cfg,
        **{
            "distributed.num_processes": cluster.num_processes,
            "distributed.process_id": cluster.process_id,
            "distributed.coordinator": cluster.coordinator,
        },
    )


def _flat(tree: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
    return out


def shared_fields(cfg: TrainConfig) -> dict[str, Any]:
    """The resolved config as flat dotted fields, minus those allowed to differ per process."""
    flat = _flat(dataclasses.asdict(cfg))
    return {k: v for k, v in sorted(flat.items()) if k not in _PER_PROCESS}


def config_hash(cfg: TrainConfig) -> str:
    return hashlib.sha256(json.dumps(shared_fields(cfg), sort_keys=True).encode()).hexdigest()[:12]


def agree(
    cluster: Cluster, cfg: TrainConfig, check: Callable[[TrainConfig], TrainConfig]
) -> TrainConfig:
    """Check this process, compare with every other; return the config to run.

    `check(cfg)` validates locally (raising ConfigError) and returns the config to post;
    process 0's `log.run_name` (resolved by its check) becomes everyone's. A local error, a
    remote one, or any differing field raises ConfigError on every process.
    """
    me = cluster.process_id
    try:
        cfg = check(cfg)
        post = {
            "ok": True,
            "hash": config_hash(cfg),
            "fields": shared_fields(cfg),
            "run_name": cfg.log.run_name,
        }
        error = None
    except ConfigError as local:
        post, error = {"ok": False, "error": str(local)}, RunRefused(str(local))
    cluster.store.key_value_set(_CONFIG_KEY.format(me), json.dumps(post))
    if error is not None:
        raise error
    run_name = cfg.log.run_name
    for other in range(cluster.num_processes):
        if other == me:
            continue
        theirs = json.loads(cluster.get(_CONFIG_KEY.format(other)))
        if not theirs["ok"]:
            raise RunRefused(f"process {other} cannot run: {theirs['error']}")
        if theirs["hash"] != post["hash"]:
            raise RunRefused(_mismatch(me, post, other, theirs))
        if other == 0:
            run_name = theirs["run_name"]
    return replace(cfg, **{"log.run_name": run_name})


def _mismatch(me: int, mine: dict, other: int, theirs: dict) -> str:
    a, b = mine["fields"], theirs["fields"]
    differing = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    field = differing[0] if differing else "?"
    more = f" (and {len(differing) - 1} more)" if len(differing) > 1 else ""
    return (
        f"config differs between processes: {field} is {a.get(field)!r} on process {me} but "
        f"{b.get(field)!r} on process {other}{more} "
        f"(config hash {mine['hash']} vs {theirs['hash']})"
    )


def global_learner_devices(local_ids: tuple[int, ...], platform: str | None) -> list[jax.Device]:
    """Every process's learner devices (the same local ids on each), process by process."""
    devices = []
    for process in range(jax.process_count()):
        local = [
            d
            for d in (jax.devices(platform) if platform else jax.devices())
            if d.process_index == process
        ]
        if max(local_ids) >= len(local):
            raise ConfigError(
                f"layout.learner_device_ids {list(local_ids)}: process {process} has only "
                f"{len(local)} device(s)"
            )
        devices.extend(local[i] for i in local_ids)
    return devices


def every_process_sees(cluster: Cluster, root: Path) -> bool:
    """Whether every process sees process 0's `root` (a shared filesystem): process 0
    leaves a token there, each process says whether it finds it."""
    token_key = _SHARED_KEY.format("token")
    if cluster.process_id == 0:
        token = secrets.token_hex(8)
        marker = root / f".podrace-shared-{token}"
        marker.touch()
        cluster.store.key_value_set(token_key, token)
    else:
        token = cluster.get(token_key)
        marker = root / f".podrace-shared-{token}"
    sees = marker.is_file()
    cluster.store.key_value_set(_SHARED_KEY.format(cluster.process_id), "1" if sees else "0")
    every = all(cluster.get(_SHARED_KEY.format(p)) == "1" for p in range(cluster.num_processes))
    if cluster.process_id == 0:
        marker.unlink(missing_ok=True)
    return every


def share_counters(
    cluster: Cluster, timeout_s: float, version: int, counters: dict
) -> list[dict] | None:
    """Each process's own counters go into every checkpoint (its episodes are its own
    actors'): the others hand theirs to process 0 through the coordination service (waiting
    up to `timeout_s`); process 0 gets every process's, the others None."""
    if cluster.process_id != 0:
        cluster.store.key_value_set(
            _COUNTERS_KEY.format(version, cluster.process_id), json.dumps(counters)
        )
        return None
    every = [counters]
    for process in range(1, cluster.num_processes):
        key = _COUNTERS_KEY.format(version, process)
        try:
            answer = cluster.store.blocking_key_value_get(key, int(timeout_s * 1000))
        except Exception as error:  # noqa: BLE001 - jaxlib's own error type: no answer
            raise TimeoutError(
                f"checkpoint {version}: process {process} did not hand over its counters "
                f"within {timeout_s:g}s"
            ) from error
        cluster.store.key_value_delete(key)
        every.append(json.loads(answer))
    return every


def shutdown(ok: bool, timeout_s: float = SHUTDOWN_TIMEOUT_S + 30) -> None:
    """Leave jax.distributed. After a success every process reaches the shutdown barrier
    (all are done by then: `DistributedGroup.leave` waited for process 0's final
    evaluation); after a failure a peer may be gone, so the barrier is skipped (the caller
    exits) and process 0 only stops its coordination service, freeing the coordinator's
    port."""
    if not ok or not jax.distributed.is_initialized():
        stop_hosted_service()  # process 0: the others have left (the peer link waited)
        return

    done = threading.Event()

    def leave() -> None:
        try:
            jax.distributed.shutdown()
        except Exception as error:  # noqa: BLE001 - the run is over; a peer that left first
            log.debug("jax.distributed.shutdown() raised: %r", error)
        done.set()

    threading.Thread(target=leave, name="distributed-shutdown", daemon=True).start()
    done.wait(timeout_s)


__all__ = [
    "Cluster",
    "RunRefused",
    "agree",
    "config_hash",
    "every_process_sees",
    "global_learner_devices",
    "join",
    "meet",
    "resolved",
    "share_counters",
    "shutdown",
    "shared_fields",
]
