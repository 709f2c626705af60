"""Where a run's pieces run: one cluster x one fleet, from a table.

A run (`podrace.runtime.run`) is one skeleton; where it runs is two independent choices:

- the cluster (`podrace.runtime.cluster`): which processes make the run and how they meet
  and leave;
- the fleet (`podrace.runtime.fleet`): who steps envs and who chooses actions.

`TOPOLOGIES` says which combinations exist and builds them; the config picks the cluster
(`--runtime ray`; `--distributed.*`) and the fleet (`--env.workers`,
`--layout.inference server`):

| cluster \\ fleet  | actor-threads | served-actors                   | ray-workers |
| ---------------- | ------------- | ------------------------------- | ----------- |
| one-process      | threads       | threads (env worker processes)  | -           |
| jax.distributed  | multihost     | multihost (env worker processes)| -           |
| ray              | -             | ray (env workers as Ray actors) | ray         |

(the names are `TrainResult.topology`'s). Everything here is imported lazily: choosing a
topology imports neither JAX nor Ray.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from podrace.config import ConfigError, TrainConfig, distributed_requested

if TYPE_CHECKING:
    from podrace.runtime.cluster import Cluster
    from podrace.runtime.fleet import Fleet


@dataclass(frozen=True)
class Topology:
    """One run's cluster and fleet."""

    cluster: Cluster
    fleet: Fleet
    name: str
    """What `TrainResult.topology` says: `threads`, `ray` or `multihost`."""


def _one_process_threads() -> Topology:
    from podrace.runtime.cluster import OneProcess
    from podrace.runtime.threads.actors import ActorThreads

    return Topology(OneProcess(), ActorThreads(), "threads")


def _one_process_served() -> Topology:
    from podrace.runtime.cluster import OneProcess
    from podrace.runtime.threads.served import ServedActors

    return Topology(OneProcess(), ServedActors(), "threads")


def _distributed_threads() -> Topology:
    from podrace.runtime.multihost.group import DistributedGroup
    from podrace.runtime.threads.actors import ActorThreads

    return Topology(DistributedGroup(), ActorThreads(), "multihost")


def _distributed_served() -> Topology:
    from podrace.runtime.multihost.group import DistributedGroup
    from podrace.runtime.threads.served import ServedActors

    return Topology(DistributedGroup(), ServedActors(), "multihost")


def _ray_workers() -> Topology:
    from podrace.runtime.ray.cluster import local_cpus
    from podrace.runtime.ray.driver import RayDriver
    from podrace.runtime.ray.workers import RayWorkers

    driver = RayDriver(cpus=lambda cfg: local_cpus(cfg.ray))
    return Topology(driver, RayWorkers(driver), "ray")


def _ray_served() -> Topology:
    from podrace.runtime.ray.driver import RayDriver
    from podrace.runtime.ray.served import ray_env_workers, served_cpus
    from podrace.runtime.threads.actors import spread_device
    from podrace.runtime.threads.served import ServedActors

    driver = RayDriver(cpus=served_cpus)
    return Topology(driver, ServedActors(ray_env_workers(driver), spread_device), "ray")


TOPOLOGIES: dict[tuple[str, str], Callable[[], Topology]] = {
    ("one-process", "actor-threads"): _one_process_threads,
    ("one-process", "served-actors"): _one_process_served,
    ("jax.distributed", "actor-threads"): _distributed_threads,
    ("jax.distributed", "served-actors"): _distributed_served,
    ("ray", "ray-workers"): _ray_workers,
    ("ray", "served-actors"): _ray_served,
}
"""(cluster, fleet) -> a new topology of that cluster and that fleet."""


def cluster_kind(cfg: TrainConfig) -> str:
    """The cluster `cfg` asks for: a Ray driver, a jax.distributed group, or one process."""
    if cfg.runtime == "ray":
        if distributed_requested(cfg):
            raise ConfigError(
                "--runtime ray cannot be combined with --distributed.*: run one learner process"
            )
        return "ray"
    return "jax.distributed" if distributed_requested(cfg) else "one-process"


def fleet_kind(cfg: TrainConfig) -> str:
    """The fleet `cfg` asks for: env workers served by inference threads, Ray workers, or
    actor threads."""
    if cfg.runtime == "ray":
        return "served-actors" if cfg.layout.inference == "server" else "ray-workers"
    return "served-actors" if cfg.env.workers else "actor-threads"


def topology_for(cfg: TrainConfig) -> Topology:
    """A new topology of the cluster and the fleet `cfg` asks for; ConfigError (one line)
    for a combination `TOPOLOGIES` does not hold."""
    cluster, fleet = cluster_kind(cfg), fleet_kind(cfg)
    make = TOPOLOGIES.get((cluster, fleet))
    if make is None:
        runs_on = sorted(c for c, f in TOPOLOGIES if f == fleet)
        raise ConfigError(
            f"the {fleet} fleet does not run on a {cluster} cluster (it runs on: "
            f"{', '.join(runs_on) or 'none'})"
        )
    return make()


__all__ = ["TOPOLOGIES", "Topology", "cluster_kind", "fleet_kind", "topology_for"]
