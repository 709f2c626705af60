"""The multi-host topology: N processes (jax.distributed), each the thread topology for
its own actors, all learners one `jit(shard_map)` over the global learner mesh.

Every process runs the same command. Before any thread starts, the processes meet, open
the peer link (`peers`), join jax.distributed, check themselves and compare configs
(`distributed.agree`), and build a `SingleHostRun` whose learner mesh is every process's
learner devices. Each process's actors feed only that process's shards; the learner step is
the same SPMD program everywhere, so params stay identical on every process, and each
process publishes them to its own actors through its local sync transport.

Seeds: actor keys and env seeds derive from (run seed, global actor id), the global id being
process id x actors per process + local id, so a 2-process run with one actor each samples
like a 1-process run with two actors; learner keys belong to envs (`learner_mesh.env_keys`).

Files: process 0 owns the run directory (config.json, metrics.jsonl with the global learner
metrics and env-step counter, its own actors' episode statistics, and all evaluation).
Process i > 0 does not evaluate and writes its own metrics (its actors' episodes, timers)
to `<run dir>/process-<i>/metrics.jsonl`: on a shared filesystem everything lands in one
run directory, otherwise each host keeps its own part.

Failure: a lost process (exit, kill, hang, error, Ctrl-C) reaches every other one through
the peer link, which fails the local run naming that process; a learner whose collective
failed waits briefly for that news so the error names the process, not the socket.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import jax

from podrace.config import TrainConfig, replace
from podrace.control import Lifetime, raise_stopped_if_stopping
from podrace.envs import EnvSource, resolve_backend
from podrace.runtime.coordination_service import stop_hosted_service
from podrace.runtime.devices import resolve_devices
from podrace.runtime.distributed import (
    SHUTDOWN_TIMEOUT_S,
    Cluster,
    RunRefused,
    agree,
    global_learner_devices,
    join,
    meet,
    resolved,
)
from podrace.runtime.peers import PeerLink, PeerLost, PeerStopped
from podrace.runtime.rundir import check_run_dir, create_run_dir, discard_if_untrained, run_dir_path
from podrace.runtime.single_host import SingleHostRun, TrainResult
from podrace.runtime.std_streams import write_stderr_now
from podrace.validation import validate

HUB_EXIT_WAIT_S = 5.0
"""Process 0, leaving after a loss or a stop, waits this long for the others to exit first
(`PeerLink.wait_others_gone`)."""
COLLECTIVE_GRACE_S = 5.0
"""After a failed collective, seconds the learner waits for the peer link to say which
process was lost (the link hears of a killed process at once)."""


def prepare(cfg: TrainConfig, lifetime: Lifetime | None = None) -> MultiHostRun:
    """Join the other processes, agree on the config, build and compile; no thread started.

    The peer link opens first (right after the processes met, before jax.distributed
    starts, where the flags name them): from then on a lost peer ends this process at once
    (printing which one) until `run()` takes over, and a local error is told to the others.
    """
    lifetime = lifetime or Lifetime()
    validate(cfg)
    d = cfg.distributed
    link = None
    try:
        hub = meet(d, lifetime.check)
        if (
            hub is not None
        ):  # every process is there: one not connecting within the peer timeout hung
            link = _started(
                PeerLink.open(
                    d.process_id,
                    d.num_processes,
                    d.peer_timeout_s,
                    hub,
                    d.peer_timeout_s,
                    lifetime.check,
                ),
                lifetime,
            )
        cluster = join(d)
        if link is None:  # JAX detected the processes: the link's address goes through its store
            link = _started(PeerLink.open_through(cluster, d.peer_timeout_s), lifetime)
        cfg = agree(cluster, resolved(cfg, cluster), _check)
        devices = resolve_devices(cfg)
        devices = dataclasses.replace(
            devices,
            learners=tuple(
                global_learner_devices(cfg.layout.learner_device_ids, cfg.layout.platform)
            ),
        )
        if cluster.process_id == 0:
            run_dir = lifetime.run_dir = create_run_dir(cfg)
            cluster.store.key_value_set(_RUN_DIR_KEY, str(run_dir))
        else:  # its own part only, inside process 0's run directory (made first)
            cluster.get(_RUN_DIR_KEY)
            run_dir = run_dir_path(cfg) / f"process-{cluster.process_id}"
            run_dir.mkdir(parents=True, exist_ok=True)
            lifetime.run_dir = run_dir
        (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
        envs = EnvSource(cfg.env)
        local = SingleHostRun(cfg, envs.spec(), devices, run_dir, lifetime, envs)
    except PeerLost as lost:  # a process vanished before every link was open
        _exit_while_preparing(lost, lifetime, link)
    except RunRefused:  # every process refuses alike; none of them is lost to the others
        if link is not None:
            link.report_refused()
            link.close()
        raise
    except BaseException as error:
        if link is not None:
            link.report_failure(f"while preparing: {type(error).__name__}: {error}".splitlines()[0])
            link.close()
        discard_if_untrained(lifetime.run_dir, None)
        raise_stopped_if_stopping(
            lifetime, error
        )  # e.g. a stop closed the publisher under subscribe()
        raise
    return MultiHostRun(cluster, link, local)


_RUN_DIR_KEY = "podrace/run-dir"
"""Set by process 0 once it made the run directory, in which the others make their part."""


def _started(link: PeerLink, lifetime: Lifetime) -> PeerLink:
    """Listening: a loss ends this process (`_exit_while_preparing`), a stop here is told."""
    # On its own thread: it waits for the others' connections to close, which the reader
    # that reported the loss must stay free to see (else it waits out HUB_EXIT_WAIT_S).
    link.start(
        lambda lost: threading.Thread(
            target=_exit_while_preparing,
            args=(lost, lifetime, link),
            name="peer-lost-exit",
            daemon=True,
        ).start()
    )
    lifetime.on_stop(lambda: _tell_peers(lifetime, link))
    return link


def _exit_while_preparing(lost: PeerLost, lifetime: Lifetime, link: PeerLink | None) -> NoReturn:
    """A peer was lost before this process's threads started: the main thread may be
    joining, compiling or inside a collective, so report and leave from here (a run
    directory that holds no update is removed, as after any stop before the first update)."""
    discard_if_untrained(lifetime.run_dir, None)
    if link is not None:
        link.wait_others_gone(HUB_EXIT_WAIT_S)
    stop_hosted_service()  # process 0: the coordinator's port is free again at once
    if isinstance(lost, PeerStopped):  # as once training runs (train_command)
        write_stderr_now(f"podrace: {lost}, stopped\n")
        os._exit(128 + lost.signum)
    write_stderr_now(
        f"podrace: error: process-{lost.process} failed: {type(lost).__name__}: {lost}\n"
    )
    os._exit(1)


def _check(cfg: TrainConfig) -> TrainConfig:
    """This process alone: valid config, env, local devices, global mesh; process 0 also
    fixes the run directory's name (everyone uses process 0's)."""
    validate(cfg)
    resolve_backend(cfg.env)
    resolve_devices(cfg)
    global_learner_devices(cfg.layout.learner_device_ids, cfg.layout.platform)
    if cfg.distributed.process_id == 0:
        cfg = replace(cfg, **{"log.run_name": check_run_dir(cfg).name})
    return cfg


class MultiHostRun:
    """One process's part of a multi-host run; `run()` starts its threads."""

    def __init__(self, cluster: Cluster, link: PeerLink, local: SingleHostRun):
        self.cluster, self.link, self.local = cluster, link, local
        self.cfg, self.lifetime = local.cfg, local.lifetime
        self.run_dir: Path = local.run_dir
        learner = local.learner
        update = learner.update_fn

        def update_or_name_the_lost_process(*args):
            try:
                # A collective fails when its result is waited for, not at dispatch.
                return jax.block_until_ready(update(*args))
            except Exception as error:
                lost = link.wait_lost(COLLECTIVE_GRACE_S)
                if lost is not None:
                    raise lost from error
                raise

        update_or_name_the_lost_process.__wrapped__ = update  # the jitted step (for lowering)
        learner.update_fn = update_or_name_the_lost_process

    @property
    def stuck(self) -> list[str]:
        """Threads left behind at the end (e.g. a learner waiting in a collective)."""
        return self.local.stuck

    def run(self) -> TrainResult:
        """This process's part; on success the link stays open for `leave`."""
        lifetime = self.lifetime
        self.link.on_lost(lambda lost: lifetime.fail(f"process-{lost.process}", lost))
        try:
            return self.local.run()
        except BaseException as error:
            if isinstance(
                getattr(error, "error", None), PeerStopped
            ):  # stopped from another process
                discard_if_untrained(
                    lifetime.run_dir, self.local.learner.version
                )  # as after a stop here
            self.link.wait_others_gone(HUB_EXIT_WAIT_S)
            self.link.close()
            raise

    def leave(self, interrupted: Callable[[], int | None]) -> None:
        """After `run`: say this process is done and wait until every process is (process 0
        may still be evaluating), so that all leave jax.distributed together. A loss meanwhile
        raises it (ComponentError); a signal (`interrupted()` gives its number) is told to the
        others, which stop too, and ends the wait."""
        try:
            if not interrupted():
                self.link.report_done()
            while not self.link.wait_all_done(0.05):
                if self.lifetime.failure is not None:
                    raise self.lifetime.failure
                if interrupted():
                    break
            signum = interrupted()
            if signum and not self.link.wait_all_done(0):
                self.link.report_stop(signum, signal.Signals(signum).name)
        finally:
            if not self.link.wait_all_done(0):
                self.link.wait_others_gone(HUB_EXIT_WAIT_S)
            self.link.close()


def _tell_peers(lifetime: Lifetime, link: PeerLink) -> None:
    """Called once when this process's run stops: tell the others why, unless they told us.
    A finished run says nothing here: `done` comes after the whole run (MultiHostRun.leave)."""
    failure = lifetime.failure
    if failure is not None:
        if not isinstance(failure.error, PeerLost):
            link.report_failure(str(failure))
    elif (
        lifetime.stop_reason != "finished"
    ):  # stopped from outside: the CLI's reason names the signal
        name = (lifetime.stop_reason or "").split(" ")[0]
        signum = signal.Signals[name] if name in signal.Signals.__members__ else signal.SIGINT
        link.report_stop(int(signum), signum.name)


def shutdown(ok: bool, timeout_s: float = SHUTDOWN_TIMEOUT_S + 30) -> None:
    """Leave jax.distributed. After a success every process reaches the shutdown barrier
    (all are done by then: `MultiHostRun.leave` waited for process 0's final evaluation);
    after a failure a peer may be gone, so the barrier is skipped (the caller exits) and
    process 0 only stops its coordination service, freeing the coordinator's port."""
    import logging
    import threading

    import jax

    if not ok or not jax.distributed.is_initialized():
        stop_hosted_service()  # process 0: the others have left (the peer link waited for them)
        return

    done = threading.Event()

    def leave() -> None:
        try:
            jax.distributed.shutdown()
        except Exception as error:  # noqa: BLE001 - the run is over; a peer that left first is fine
            logging.getLogger(__name__).debug("jax.distributed.shutdown() raised: %r", error)
        done.set()

    threading.Thread(target=leave, name="distributed-shutdown", daemon=True).start()
    done.wait(timeout_s)


__all__ = ["MultiHostRun", "prepare", "shutdown"]
