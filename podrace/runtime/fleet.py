"""A run's fleet: who steps envs and who chooses actions, and how params and rollouts flow.

One of a topology's two axes (`podrace.runtime.topology`); the other, the cluster
(`podrace.runtime.cluster`), says which processes make the run. Three fleets exist:

- `ActorThreads` (`podrace.runtime.threads.actors`): one thread per actor steps its envs
  and acts on its device;
- `ServedActors` (`podrace.runtime.threads.served`): env workers (processes, or Ray actors
  on any node) step the envs, inference threads choose every actor's actions;
- `RayWorkers` (`podrace.runtime.ray.workers`): Ray workers run the actor loop anywhere in
  a Ray cluster; this process collects their rollouts.

Fleets share code by composition (`threads.actors.LocalActors`: keys, devices and
checkpoints of this process's actors), never by subclassing one another.

A fleet's life, in the order the run skeleton (`podrace.runtime.run`) calls it: before the
learner exists, `publisher` and `pipeline` (how params reach its actors, how rollouts
arrive) and `saved_actor_count` (to read a checkpoint); then `restore` (where its actors
start, given the `FleetContext`), `start` (they build and compile while the learner
compiles on `learner_dummies`), `ready`; while the run goes, `loops`, `save` at every
update, `line_extras`; at the end `env_owners` (envs to close), `report` and `close`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from podrace.config import ConfigError

if TYPE_CHECKING:
    from podrace.actor import PolicyFns
    from podrace.checkpoints.state import RunState
    from podrace.config import TrainConfig
    from podrace.control import Control, Heartbeat, Lifetime
    from podrace.envs import EnvSource
    from podrace.learner_mesh import LearnerPlacement
    from podrace.metrics.registry import Metrics
    from podrace.pipeline import Pipeline
    from podrace.runtime.devices import Devices
    from podrace.runtime.faults import Faults
    from podrace.sync.base import Publisher
    from podrace.types import EnvSpec, Trajectory


@dataclass(frozen=True)
class FleetContext:
    """What a fleet may use of the run it serves (never the run itself)."""

    cfg: TrainConfig
    spec: EnvSpec
    envs: EnvSource
    devices: Devices
    lifetime: Lifetime
    metrics: Metrics
    pipeline: Pipeline
    """The fleet's own pipeline (`Fleet.pipeline`), which the learner reads."""
    publisher: Publisher
    """The fleet's own publisher (`Fleet.publisher`), which the learner writes."""
    placement: LearnerPlacement
    """Puts a rollout's arrays onto the learner mesh."""
    network: Any
    policy_fns: PolicyFns
    published: Any
    """The first params as a subscriber receives them (to compile on)."""
    control: Callable[[str], Control]
    """A loop's stop check, heartbeat (watched by the run's watchdog) and metrics."""
    heartbeat: Callable[[str], Heartbeat]
    faults: Faults
    topology: str
    """The topology's name, for messages (`threads`, `ray`, `multihost`)."""
    process_id: int
    num_processes: int
    version: Callable[[], int]
    """The learner's version now."""


class Fleet(Protocol):
    """Who steps envs and who chooses actions; one instance per run."""

    def publisher(self, first_version: int) -> Publisher:
        """Where the learner publishes params for this fleet's actors."""

    def published(self, params: Any) -> Any:
        """`params` as a subscriber of `publisher` receives them (to compile on)."""

    def pipeline(self, cfg: TrainConfig, lifetime: Lifetime, first_seq: int) -> Pipeline:
        """What carries rollouts to the learner, from `first_seq` on."""

    def saved_actor_count(self, cfg: TrainConfig, num_processes: int) -> int:
        """How many actors a checkpoint keeps (every process's)."""

    def restore(self, ctx: FleetContext, restored: RunState | None) -> Mapping[str, Any]:
        """Where the actors start: fresh, or from `restored` (ConfigError when this fleet
        cannot continue from it); returns `save` at the start version."""

    def start(self) -> None:
        """Start building the actors (they may compile while the learner does)."""

    def learner_dummies(self) -> list[Trajectory]:
        """One placed dummy rollout per actor, shaped and sharded as that actor's arrive."""

    def ready(self) -> None:
        """Return once every actor is built and compiled, ready to start."""

    def loops(self) -> list[tuple[str, Callable[[], None]]]:
        """The (name, function) of every thread that delivers rollouts into the pipeline."""

    def save(self, version: int) -> Mapping[str, Any]:
        """What a checkpoint at `version` keeps of the actors: `actor_keys` (the raw key each
        actor started this run with), `actor_next_seq` and `actor_restarts`."""

    def line_extras(self) -> dict[str, float]:
        """Values this fleet adds to every metrics line."""

    def env_owners(self) -> list[tuple[str, Any]]:
        """(thread name, env) of every env this process owns, for closing them."""

    def report(self) -> Any:
        """What the fleet adds to the TrainResult (None: nothing)."""

    def close(self) -> None:
        """Stop and release the actors' workers, processes and connections; idempotent."""


def continued_version(restored: RunState, count: int, who: str, what: str) -> int:
    """The version `restored` was saved at; ConfigError unless every one of its `count`
    actors (called `who`: actor, worker) continues at that version, the only place `what`
    (the fleet, for the message) resumes from."""
    version = restored.version
    if tuple(restored.actor_next_seq) != (version,) * count:
        raise ConfigError(
            f"checkpoint {version} has {who}s' next rollouts {list(restored.actor_next_seq)}; "
            f"{what} resumes only where every {who} continues at {version}"
        )
    return version


__all__ = ["Fleet", "FleetContext", "continued_version"]
