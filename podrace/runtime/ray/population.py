"""A population on Ray (`--pbt.population N --runtime ray`): one Ray connection for the
whole population, each member a Ray-worker run whose workers are its actors.

The population's driver process holds every member's learner, evaluator and run directory;
`SharedRay` starts or joins Ray once for all of them (a private local Ray advertises one
CPU per worker of every member) and leaves it once every member has stopped. Each member's
topology (`member_topology`) is a `RayWorkers` fleet of its own (its own publisher,
collector, worker restarts and data order) over a `RayMember` cluster, which uses the
shared connection and never joins or leaves Ray itself.

Sharing: every member has `--ray.num-workers` workers (each one CPU and the worker
resources), so a population of N asks the cluster for N x that many, and each member's
rollouts are what one run's would be. A member's lost worker is restarted by that member's
collector as in any Ray run; the other members go on meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from podrace.checkpoints.files import Writers
from podrace.config import TrainConfig, replace
from podrace.control import Lifetime
from podrace.envs.source import EnvSource
from podrace.rundir import RunLock
from podrace.runtime.cluster import OneProcess
from podrace.runtime.devices import Devices
from podrace.runtime.ray.cluster import local_cpus
from podrace.runtime.ray.driver import RayDriver
from podrace.runtime.topology import Topology


def whole_population(cfg: TrainConfig) -> TrainConfig:
    """`cfg` as the Ray cluster sees the population: every member's workers at once."""
    return replace(cfg, **{"ray.num_workers": cfg.pbt.population * cfg.ray.num_workers})


class SharedRay:
    """The population's one Ray connection: `check` before anything is written, `join`
    once, `leave` once every member has stopped."""

    def __init__(self) -> None:
        self.driver = RayDriver(cpus=lambda cfg: local_cpus(cfg.ray))

    def check(self, cfg: TrainConfig, envs: EnvSource | None) -> None:
        self.driver.check(cfg, envs)

    def join(self, cfg: TrainConfig, lifetime: Lifetime, root: Path) -> None:
        """Start or join Ray; Ray's messages to the driver go to `root` (the population's
        run directory). ConfigError for a cluster that cannot hold every member's workers."""
        self.driver.check(cfg, None)
        self.driver.join(whole_population(cfg), lifetime, resuming=True)
        self.driver.connection.messages.attach(root)

    def leave(self) -> None:
        self.driver.leave()

    def topology(self) -> Topology:
        """A member's topology: its own Ray workers over the shared connection."""
        from podrace.runtime.ray.workers import RayWorkers

        return Topology(RayMember(self.driver), RayWorkers(self.driver), "ray")


class RayMember:
    """One member's cluster: the population's Ray connection (joined and left by the
    population), this process's devices, run directory and checkpoints."""

    name = "ray"
    process_id = 0
    num_processes = 1
    stop_grace_s = RayDriver.stop_grace_s
    exit_grace_s = RayDriver.exit_grace_s

    def __init__(self, driver: RayDriver) -> None:
        self.driver = driver
        self._local = OneProcess()

    @property
    def ray(self):
        return self.driver.ray

    @property
    def connection(self):
        return self.driver.connection

    def check(self, cfg: TrainConfig, envs: EnvSource | None) -> None:
        pass  # the population checked its config and envs once

    def join(self, cfg: TrainConfig, lifetime: Lifetime, resuming: bool) -> TrainConfig:
        return cfg  # the population joined

    def devices(self, cfg: TrainConfig) -> Devices:
        return self._local.devices(cfg)

    def lock_resumed(self, run_dir: Path) -> RunLock:
        return self._local.lock_resumed(run_dir)

    def claim_run_dir(
        self, cfg: TrainConfig, lifetime: Lifetime, resumed: Path | None
    ) -> tuple[Path, Path]:
        return self._local.claim_run_dir(cfg, lifetime, resumed)

    def writers(self) -> Writers:
        return self._local.writers()

    def watch(self, lifetime: Lifetime) -> None:
        pass  # a lost node costs workers, which the member's fleet restarts

    def explain(self, error: BaseException) -> BaseException:
        return error

    def last_save_version(
        self, recorded: int, returned: bool, abandon_write: Callable[[], None]
    ) -> int | None:
        return self._local.last_save_version(recorded, returned, abandon_write)

    def release(self, updates: int) -> None:
        pass  # the population leaves Ray once every member has stopped

    def leave(
        self,
        error: BaseException | None = None,
        interrupted: Callable[[], int | None] | None = None,
    ) -> None:
        pass


__all__ = ["RayMember", "SharedRay", "whole_population"]
