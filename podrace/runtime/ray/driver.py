"""The Ray cluster: this process is the run's driver (learner, evaluator, run directory) and
the fleet's workers are Ray actors on any node of a Ray cluster it starts or joins.

`join` connects (`podrace.runtime.ray.cluster.connect`: a private local Ray, or the
cluster `--ray.address` names; what Ray prints for the driver goes to the run directory
once it is claimed); `release` and `leave` disconnect (stopping a private Ray).
Devices, the run directory and checkpoints are this process's alone, as in `OneProcess`,
which the driver uses for them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from podrace.checkpoints.files import Writers
from podrace.config import TrainConfig
from podrace.control import Lifetime
from podrace.envs.source import EnvSource
from podrace.rundir import RunLock
from podrace.runtime.cluster import OneProcess
from podrace.runtime.devices import Devices
from podrace.runtime.ray import cluster as ray_cluster


class RayDriver:
    """This process drives a Ray cluster; `ray` is the Ray module once joined."""

    name = "ray"
    process_id = 0
    num_processes = 1
    stop_grace_s = 10.0  # killing workers wakes the threads that wait on them
    exit_grace_s = 30.0  # killing workers and stopping a local Ray take seconds

    def __init__(self, cpus: Callable[[TrainConfig], int], joined: RayDriver | None = None) -> None:
        self.cpus = cpus
        """config -> CPUs a private local Ray advertises (what the fleet's workers take)."""
        self.joined = joined
        """The driver whose Ray this one uses (a population member's: the population checks,
        joins and leaves Ray once, and Ray's messages go to its directory); None: its own."""
        self.ray: Any = None
        self.connection: ray_cluster.Cluster | None = None
        """The Ray cluster joined (its session's temp dir, whether it was started here)."""
        self._local = OneProcess()
        self._stack = contextlib.ExitStack()

    def check(self, cfg: TrainConfig, envs: EnvSource | None) -> None:
        if self.joined is not None:
            return
        # Ray's C++ crash handler also catches SIGTERM and re-raises it after podrace's,
        # which made one SIGTERM look like two; crash stack traces stay in Ray's logs.
        os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
        ray_cluster.import_ray()  # a missing Ray is a one-line error before JAX starts
        ray_cluster.check_auth_not_disabled()
        if envs is not None:  # the workers build them: a factory must pickle
            ray_cluster.check_envs_sendable(envs)

    def join(self, cfg: TrainConfig, lifetime: Lifetime, resuming: bool) -> TrainConfig:
        import ray

        self.ray = ray
        lifetime.check()
        if self.joined is not None:
            self.connection = self.joined.connection
            return cfg
        self.connection = self._stack.enter_context(
            ray_cluster.connect(cfg.ray, num_cpus=self.cpus(cfg))
        )
        return cfg

    def devices(self, cfg: TrainConfig) -> Devices:
        return self._local.devices(cfg)

    def lock_resumed(self, run_dir: Path) -> RunLock:
        return self._local.lock_resumed(run_dir)

    def claim_run_dir(
        self, cfg: TrainConfig, lifetime: Lifetime, resumed: Path | None
    ) -> tuple[Path, Path]:
        run_dir, root = self._local.claim_run_dir(cfg, lifetime, resumed)
        if self.joined is None:
            self.connection.messages.attach(run_dir)  # Ray's messages to the driver go there
        return run_dir, root

    def writers(self) -> Writers:
        return self._local.writers()

    def watch(self, lifetime: Lifetime) -> None:
        pass  # a lost node costs workers, which the fleet restarts

    def explain(self, error: BaseException) -> BaseException:
        return error

    def last_save_version(
        self, recorded: int, returned: bool, abandon_write: Callable[[], None]
    ) -> int | None:
        return self._local.last_save_version(recorded, returned, abandon_write)

    def release(self, updates: int) -> None:
        """Leave Ray (stopping a private local Ray) unless `joined` holds it; idempotent."""
        self._stack.close()

    def leave(
        self,
        error: BaseException | None = None,
        interrupted: Callable[[], int | None] | None = None,
    ) -> None:
        self._stack.close()


__all__ = ["RayDriver"]
