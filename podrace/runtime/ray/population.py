"""A population on Ray (`--pbt.population N --runtime ray`): one Ray connection for the
whole population, each member a Ray-worker run whose workers are its actors.

The population's driver process holds every member's learner, evaluator and run directory;
`SharedRay` starts or joins Ray once for all of them (a private local Ray advertises one
CPU per worker of every member) and leaves it once every member has stopped. Each member's
topology (`member_topology`) is a `RayWorkers` fleet of its own (its own publisher,
collector, worker restarts and data order) over a `RayDriver` joined to the population's,
which uses the shared connection and never joins or leaves Ray itself.

Sharing: every member has `--ray.num-workers` workers (each one CPU and the worker
resources), so a population of N asks the cluster for N x that many, and each member's
rollouts are what one run's would be. A member's lost worker is restarted by that member's
collector as in any Ray run; the other members go on meanwhile.
"""

from __future__ import annotations

from pathlib import Path

from podrace.config import TrainConfig, replace
from podrace.control import Lifetime
from podrace.envs.source import EnvSource
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

        member = RayDriver(self.driver.cpus, joined=self.driver)
        return Topology(member, RayWorkers(self.driver), "ray")


__all__ = ["SharedRay", "whole_population"]
