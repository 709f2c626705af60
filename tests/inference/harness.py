"""An inference server with its actors, env workers, a pipeline and a stand-in learner, in
threads of the test's process; `Served.close()` stops and joins everything and ends every
worker process."""

from __future__ import annotations

import threading
from collections.abc import Callable

import jax
import numpy as np

from podrace.actor import ActorSettings
from podrace.config import EnvConfig
from podrace.control import Control, Lifetime, Watchdog
from podrace.envs import EnvSource
from podrace.envs.workers import EnvWorker, split_envs
from podrace.inference.batching import ServerSettings
from podrace.inference.policy import make_key_chain, make_serve_fn
from podrace.inference.rollouts import ServedActor
from podrace.inference.server import InferenceServer
from podrace.metrics.registry import Metrics
from podrace.pipeline import Pipeline
from podrace.runtime.threads.group import ThreadGroup
from podrace.sync.local import LocalPublisher
from tests.inference import fake_envs

JOIN_S = 30.0
"""How long `Served.close()` waits for the run's threads to end: a bound for a hang, far
above what a stop takes on a loaded machine (it returns as soon as they have ended)."""


class ListSink:
    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.rollouts = []

    def put(self, rollout) -> float:
        self.rollouts.append(rollout)
        return self.pipeline.put(rollout)


class Served:
    """`actors` actors of `envs` envs each, in `parts` workers, served by one server."""

    def __init__(
        self,
        actors: int = 2,
        parts: int = 2,
        envs: int = 4,
        length: int = 4,
        rollouts: int = 3,
        lag: int = 1,
        factory: Callable | None = None,
        learner: Callable | None = None,
        watchdog_s: float = 30.0,
        **settings,
    ) -> None:
        self.lifetime = lifetime = Lifetime()
        self.metrics = Metrics()
        self.watchdog = Watchdog(lifetime, watchdog_s)
        self.publisher = LocalPublisher()
        self.publisher.publish(fake_envs.params(0))
        self.pipeline = Pipeline(actors, 1, lag, lifetime)
        self.length, self.rollouts_each = length, rollouts
        source = EnvSource(EnvConfig(), factory=factory or fake_envs.CheckedEnvs())
        device = jax.devices("cpu")[0]
        self.workers: list[EnvWorker] = []
        self.actors: list[ServedActor] = []
        self.sinks: list[ListSink] = []
        self.consumed: list[list] = []
        try:
            for a in range(actors):
                workers = [
                    EnvWorker(f"a{a}.w{j}", source, fake_envs.SPEC, envs, 1000 + a, part)
                    for j, part in enumerate(split_envs(envs, parts))
                ]
                self.workers += workers
                for worker in workers:
                    worker.start()
            for worker in self.workers:
                worker.wait_started()
            for a in range(actors):
                sink = ListSink(self.pipeline)
                self.sinks.append(sink)
                settings_a = ActorSettings(a, length, rollouts, lag, jax.random.PRNGKey(a))
                self.actors.append(
                    ServedActor(
                        settings_a,
                        fake_envs.SPEC,
                        envs,
                        self.workers[a * parts : (a + 1) * parts],
                        sink,
                        self.control(f"actor-{a}"),
                        self.watchdog.heartbeat,
                        device,
                    )
                )
            self.server = InferenceServer(
                "server",
                ServerSettings(rollout_length=length, max_policy_lag=lag, **settings),
                self.actors,
                make_serve_fn(fake_envs.fake_apply, envs, envs // parts),
                make_key_chain(length),
                device,
                self.control("server"),
            )
        except BaseException:
            for worker in self.workers:
                worker.close()
            raise
        self.learner = learner or self.default_learner
        self.group: ThreadGroup | None = None
        self.finished = threading.Event()

    def control(self, name: str) -> Control:
        return Control(self.lifetime, self.watchdog.heartbeat(name), self.metrics.add_many)

    def default_learner(self) -> None:
        """Consume one rollout per actor per update; publish version v + 1 after update v."""
        for version in range(self.rollouts_each):
            batch, _ = self.pipeline.next_batch(version)
            self.consumed.append(batch)
            self.publisher.publish(fake_envs.params(version + 1))
        self.finished.set()

    def start(self, watchdog: bool = True) -> Served:
        """Start the run's threads; without `watchdog`, all but the watchdog (the test
        starts it with `start_watchdog` once the run is where it wants it)."""
        self.publisher.add_push_target(self.server.push, "server")
        self.group = group = ThreadGroup(self.lifetime)
        group.spawn("server", self.server.run)
        for actor in self.actors:
            group.spawn(f"actor-{actor.actor_id}", actor.run)
        group.spawn("learner", self.learner)
        if watchdog:
            self.start_watchdog()
        return self

    def start_watchdog(self) -> None:
        self.group.spawn("watchdog", self.watchdog.run, guard_transfers=False)

    def wait(self, timeout: float = 60.0) -> None:
        """Until the stand-in learner finished or the run failed (then raise its error)."""
        from tests.waiting import wait_until

        wait_until(lambda: self.finished.is_set() or self.lifetime.stopping, timeout)
        if self.lifetime.failure is not None:
            raise self.lifetime.failure

    def close(self) -> list[str]:
        self.lifetime.stop("test over")
        stuck = self.group.join(JOIN_S) if self.group is not None else []
        self.publisher.close()
        for worker in self.workers:
            worker.close()
        self.server.close()
        return stuck

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_rollout(rollout, length: int) -> None:
    """What the server recorded is consistent: every action is the fake policy's choice for
    its own observation, every value the version that served it, and env ids stay put."""
    traj = rollout.trajectory
    obs, actions = np.asarray(traj.obs), np.asarray(traj.actions)
    assert obs.shape[0] == length
    np.testing.assert_array_equal(actions, fake_envs.expected_action(obs))
    np.testing.assert_array_equal(np.asarray(traj.values), rollout.behaviour_versions)
    assert rollout.policy_version == rollout.behaviour_versions.min()
    ids = obs[..., 0]
    assert (ids == ids[0]).all(), "an env's observations came from another env"
    np.testing.assert_array_equal(np.asarray(traj.last_obs)[:, 0], ids[0])
