"""The jax.distributed cluster: N processes, each with its own fleet for its own actors, all
learners one `jit(shard_map)` over the global learner mesh (the `multihost` topology).

Every process runs the same command. Before any thread starts, the processes meet, open
the peer link (`peers`), join jax.distributed, check themselves and compare configs
(`distributed.agree`). Each process's actors feed only that process's shards; the learner
step is the same SPMD program everywhere, so params stay identical on every process, and
each process publishes them to its own actors through its local sync transport.

Seeds: actor keys and env seeds derive from (run seed, global actor id), the global id
being process id x actors per process + local id, so a 2-process run with one actor each
samples like a 1-process run with two actors; learner keys belong to envs
(`learner_mesh.env_keys`).

Files: process 0 owns the run directory (config.json, metrics.jsonl with the global
learner metrics and env-step counter, its own actors' episode statistics, all evaluation,
the checkpoints). Process i > 0 writes its own metrics to `<run dir>/process-<i>/`: on a
shared filesystem everything lands in one run directory, otherwise each host keeps its own
part.

Checkpoints: written by every process together (orbax's multi-process save: each process
writes its own shards of the learner keys, process 0 the rest, the manifest and the step's
rename; each process's counters, its actors' episodes among them, reach process 0's meta
through the coordination service), which needs a run directory every process sees. The
processes check that at the start: where it is not shared, a run that asks for periodic
checkpoints is refused, and one that does not writes none (a warning says so). A stop
saves the newest version every process has recorded (they differ by at most one update,
see `last_save_version`); a lost process leaves the last periodic checkpoint, which a
resume of all processes continues.

Failure: a lost process (exit, kill, hang, error, Ctrl-C) reaches every other one through
the peer link, which fails the local run naming that process; a learner whose collective
failed waits briefly for that news so the error names the process, not the socket.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from podrace.checkpoints.files import Writers
from podrace.config import ConfigError, TrainConfig, replace
from podrace.control import Lifetime, Stopped
from podrace.envs.source import EnvSource
from podrace.rundir import (
    RunLock,
    check_new_run_dir,
    create_run_dir,
    discard_if_untrained,
)
from podrace.runtime.devices import Devices, resolve_devices
from podrace.runtime.multihost.coordination_service import stop_hosted_service
from podrace.runtime.multihost.distributed import (
    Cluster,
    RunRefused,
    agree,
    every_process_sees,
    global_learner_devices,
    join,
    meet,
    resolved,
    share_counters,
    shutdown,
)
from podrace.runtime.multihost.peers import PeerLink, PeerLost, PeerStopped
from podrace.runtime.stderr import write_stderr_now

log = logging.getLogger(__name__)

HUB_EXIT_WAIT_S = 30.0
"""Process 0, leaving after a loss or a stop, waits this long for the others to exit first
(`PeerLink.wait_others_gone`; a process that exits is seen at once): its leaving ends the
coordination service, and a process still polling it then aborts (exit -6) instead of
exiting with its own code."""
COLLECTIVE_GRACE_S = 5.0
"""After a failed collective, seconds the learner waits for the peer link to say which
process was lost (the link hears of a killed process at once)."""
_RUN_DIR_KEY = "podrace/run-dir"
"""Set by process 0 once it made the run directory, in which the others make their part."""
_FINAL_KEY = "podrace/final/{}"


class DistributedGroup:
    """This process is one of a jax.distributed group's; they meet, run and leave together."""

    name = "jax.distributed"
    stop_grace_s = 1.0
    exit_grace_s = 10.0  # the last save: the processes agree on a version, then write it

    def __init__(self) -> None:
        self.process_id, self.num_processes = 0, 1  # until joined
        self.link: PeerLink | None = None
        self.cluster: Cluster | None = None
        self.lifetime: Lifetime | None = None
        self.shared = False
        """Every process sees the run directory: checkpoints are written."""
        self.watching = False
        """The run's loops started (`watch`): a lost process fails the run from then on."""
        self.peer_timeout_s = 0.0
        """How long a process may go unheard before it counts as lost (the config's)."""
        self._left = False

    def check(self, cfg: TrainConfig, envs: EnvSource | None) -> None:
        pass  # every process checks itself once they met (`join`)

    # Preparing ---------------------------------------------------------------------------
    def join(self, cfg: TrainConfig, lifetime, resuming: bool) -> TrainConfig:
        """The peer link opens first (right after the processes met, before jax.distributed
        starts, where the flags name them): from then on a lost peer ends this process at
        once (printing which one) until `watch`, and a local error is told to the
        others."""
        self.lifetime = lifetime
        d = cfg.distributed
        self.peer_timeout_s = d.peer_timeout_s
        hub = meet(d, lifetime.check)
        if hub is not None:  # every process is there: one not connecting in time hung
            link = PeerLink.open(
                d.process_id,
                d.num_processes,
                d.peer_timeout_s,
                hub,
                d.peer_timeout_s,
                lifetime.check,
            )
            self._started(link)
        self.cluster = cluster = join(d)
        if self.link is None:  # JAX detected the processes: the link's address goes
            self._started(PeerLink.open_through(cluster, d.peer_timeout_s))  # through its store
        self.process_id, self.num_processes = cluster.process_id, cluster.num_processes
        return agree(cluster, resolved(cfg, cluster), lambda c: _check(c, resuming))

    def _started(self, link: PeerLink) -> None:
        """Listening: a loss ends this process (`_exit_while_preparing`), a stop is told."""
        self.link = link
        # On its own thread: it waits for the others' connections to close, which the
        # reader that reported the loss must stay free to see.
        link.start(
            lambda lost: threading.Thread(
                target=self._exit_while_preparing,
                args=(lost,),
                name="peer-lost-exit",
                daemon=True,
            ).start()
        )
        self.lifetime.on_stop(self._tell_peers)

    def _exit_while_preparing(self, lost: PeerLost) -> NoReturn:
        """A peer was lost before this process's threads started: the main thread may be
        joining, compiling or inside a collective, so report and leave from here (a run
        directory that holds no update is removed, as after any stop before the first
        update)."""
        discard_if_untrained(self.lifetime.run_dir, None)
        if self.link is not None:
            self.link.wait_others_gone(HUB_EXIT_WAIT_S)
        stop_hosted_service()  # process 0: the coordinator's port is free again at once
        if isinstance(lost, PeerStopped):  # as once training runs (the train command)
            write_stderr_now(f"podrace: {lost}, stopped\n")
            os._exit(128 + lost.signum)
        write_stderr_now(
            f"podrace: error: process-{lost.process} failed: {type(lost).__name__}: {lost}\n"
        )
        os._exit(1)

    def _tell_peers(self) -> None:
        """Called once when this process's run stops: tell the others why, unless they told
        us. A finished run says nothing here: `done` comes after the whole run (`leave`)."""
        lifetime, link = self.lifetime, self.link
        failure = lifetime.failure
        if failure is not None:
            if not isinstance(failure.error, PeerLost):
                link.report_failure(str(failure))
        elif lifetime.stop_reason != "finished":  # stopped from outside: the reason names it
            name = (lifetime.stop_reason or "").split(" ")[0]
            signum = signal.Signals[name] if name in signal.Signals.__members__ else signal.SIGINT
            link.report_stop(int(signum), signum.name)

    def _tell_failed_start(self, error: BaseException) -> None:
        """Preparing failed with `error` before the loops started: tell the others."""
        if isinstance(error, PeerLost):  # a process vanished before every link was open
            self._exit_while_preparing(error)
        if self.link is None:
            return
        if isinstance(error, RunRefused):  # every process refuses alike; none is lost
            self.link.report_refused()
        else:
            text = f"while preparing: {type(error).__name__}: {error}"
            self.link.report_failure(text.splitlines()[0])
        self.link.close()

    def devices(self, cfg: TrainConfig) -> Devices:
        devices = resolve_devices(cfg)
        learners = global_learner_devices(cfg.layout.learner_device_ids, cfg.layout.platform)
        return dataclasses.replace(devices, learners=tuple(learners))

    def lock_resumed(self, run_dir: Path) -> RunLock:
        return RunLock(self._part(run_dir))

    def _part(self, root: Path) -> Path:
        """This process's run directory inside the run's `root` (made if missing)."""
        if self.process_id == 0:
            return Path(root)
        part = Path(root) / f"process-{self.process_id}"
        try:
            part.mkdir(exist_ok=True)
        except OSError as error:
            raise ConfigError(f"cannot create {part}: {error.strerror}") from None
        return part

    def claim_run_dir(
        self, cfg: TrainConfig, lifetime: Lifetime, resumed: Path | None
    ) -> tuple[Path, Path]:
        cluster, point = self.cluster, resumed
        if point is not None:
            root = Path(point)
        elif cluster.process_id == 0:
            root = lifetime.run_dir = create_run_dir(cfg)
            cluster.store.key_value_set(_RUN_DIR_KEY, str(root))
        else:  # its own part only, inside process 0's run directory (made first)
            cluster.get(_RUN_DIR_KEY)
            root = Path(cfg.log.run_dir) / cfg.log.run_name
        run_dir = self._part(root)
        if point is None and cluster.process_id != 0:
            lifetime.run_dir = run_dir
        self.shared = every_process_sees(self.cluster, root)
        if not self.shared:
            if cfg.checkpoint.every_updates or point is not None:
                raise RunRefused(
                    f"{'--resume' if point else '--checkpoint.every-updates'} needs a run "
                    f"directory every process sees: {root} is not shared between the processes"
                )
            log.warning(
                "checkpoints are not written: the run directory %s is not shared between "
                "the processes (orbax's multi-process checkpoints need one they all see)",
                root,
            )
        return run_dir, root

    def writers(self) -> Writers:
        share = functools.partial(share_counters, self.cluster, self.peer_timeout_s)
        return Writers(self.process_id, self.num_processes, self.shared, share_counters=share)

    # Running -------------------------------------------------------------------------
    def watch(self, lifetime: Lifetime) -> None:
        self.watching = True
        self.link.on_lost(lambda lost: lifetime.fail(f"process-{lost.process}", lost))

    def explain(self, error: BaseException) -> BaseException:
        lost = self.link.wait_lost(COLLECTIVE_GRACE_S)
        if lost is not None:
            return lost
        if self.lifetime.stopping and self.lifetime.failure is None:
            # A stop here was told to the others, which left the collective: not a failure.
            return Stopped(self.lifetime.stop_reason)
        return error

    def last_save_version(
        self, recorded: int, returned: bool, abandon_write: Callable[[], None]
    ) -> int | None:
        """The version every process saves after a stop: the newest all of them recorded.

        The learner's update is one collective, so the processes' newest recorded versions
        differ by at most one (a process stopped between an update and its record keeps
        the one before); each process keeps its last two recorded states and saves the
        agreed one. A failure, here or in another process (which the others see as a lost
        process and do not save after), or a process that does not answer within the peer
        timeout (it counts as lost then), means no last save: the last periodic checkpoint
        stands. A stop told by another process (PeerStopped) still saves."""
        failure = self.lifetime.failure
        if failure is not None and not isinstance(failure.error, PeerStopped):
            abandon_write()  # a write in progress waits for the lost process
            return None
        if not self.shared:
            return None
        cluster, latest = self.cluster, recorded
        cluster.store.key_value_set(_FINAL_KEY.format(cluster.process_id), str(latest))
        versions = []
        for process in range(cluster.num_processes):
            try:
                answer = cluster.store.blocking_key_value_get(
                    _FINAL_KEY.format(process), int(self.peer_timeout_s * 1000)
                )
            except Exception:  # noqa: BLE001 - jaxlib's own error type: no answer
                log.warning("no last checkpoint: process %d did not answer", process)
                return None
            versions.append(int(answer))
        return min(versions)

    def release(self, updates: int) -> None:
        """After a run that failed: wait for the others to leave, close the link. A run that
        finished or was stopped keeps it for `leave`, which says so to the others."""
        link, lifetime = self.link, self.lifetime
        if link is None or not self.watching or lifetime.failure is None:
            return
        if isinstance(lifetime.failure.error, PeerStopped):
            # Stopped from another process: as after a stop here.
            discard_if_untrained(lifetime.run_dir, updates)
        link.wait_others_gone(HUB_EXIT_WAIT_S)
        link.close()

    # After the run ---------------------------------------------------------------------
    def leave(
        self,
        error: BaseException | None = None,
        interrupted: Callable[[], int | None] | None = None,
    ) -> None:
        """Leave jax.distributed, once. Preparing failed (`error` before `watch`): tell the
        others, and leave together when every process refused the run alike. The run
        failed: leave at once. The run returned: `_wait_all_done` first."""
        if self._left:
            return
        self._left = True
        ok = False
        try:
            if error is not None and not self.watching:
                self._tell_failed_start(error)
                ok = isinstance(error, RunRefused)
            elif error is None:
                self._wait_all_done(interrupted or (lambda: None))
                ok = not (interrupted and interrupted())
        finally:
            if self.link is not None:
                self.link.close()
            shutdown(ok)

    def _wait_all_done(self, interrupted: Callable[[], int | None]) -> None:
        """After the run: say this process is done and wait until every process is (process
        0 may still be evaluating), so that all leave jax.distributed together. A loss
        meanwhile raises it (ComponentError); a signal (`interrupted()` gives its number)
        is told to the others, which stop too, and ends the wait."""
        link, lifetime = self.link, self.lifetime
        try:
            if not interrupted():
                link.report_done()
            while not link.wait_all_done(0.05):
                if lifetime.failure is not None:
                    raise lifetime.failure
                if interrupted():
                    break
            signum = interrupted()
            if signum and not link.wait_all_done(0):
                link.report_stop(signum, signal.Signals(signum).name)
        finally:
            if not link.wait_all_done(0):
                link.wait_others_gone(HUB_EXIT_WAIT_S)
            link.close()


def _check(cfg: TrainConfig, resuming: bool) -> TrainConfig:
    """This process alone: valid config, env, local devices, global mesh; process 0 of a
    fresh run also fixes the run directory's name (everyone uses process 0's)."""
    from podrace.envs import resolve_backend
    from podrace.runtime.devices import resolve_devices
    from podrace.validation import validate

    validate(cfg)
    resolve_backend(cfg.env)
    resolve_devices(cfg)
    global_learner_devices(cfg.layout.learner_device_ids, cfg.layout.platform)
    if cfg.distributed.process_id == 0 and not resuming:
        cfg = replace(cfg, **{"log.run_name": check_new_run_dir(cfg).name})
    return cfg


__all__ = ["DistributedGroup"]
