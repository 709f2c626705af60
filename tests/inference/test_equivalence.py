"""A rollout collected through env workers and an inference server equals the rollout the
actor loop (`podrace.actor`) collects with the same seeds, keys and params, in the
deterministic mode (lag 0, fixed batches): same observations, actions, log-probs, values,
rewards, flags and episode statistics, bit for bit."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from podrace.actor import make_policy_fns
from podrace.config import EnvConfig, NetworkConfig, TrainConfig, replace
from podrace.control import Control, Lifetime, Watchdog
from podrace.envs import EnvSource
from podrace.envs.workers import EnvWorker, split_envs
from podrace.inference.batching import ServerSettings
from podrace.inference.policy import make_key_chain, make_serve_fn
from podrace.inference.rollouts import ServedActor
from podrace.inference.server import InferenceServer
from podrace.metrics.registry import Metrics
from podrace.networks import make_network
from podrace.pipeline import Pipeline
from podrace.runtime.build import actor_env_seed, actor_settings, build_actor
from podrace.runtime.threads.group import ThreadGroup
from podrace.sync.local import LocalPublisher
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

ROLLOUTS = 3


def config(**changes) -> TrainConfig:
    cfg = TrainConfig(
        env=EnvConfig(id="CartPole-v1", backend="gymnasium", num_envs=4, max_episode_steps=9),
        network=NetworkConfig(hidden_sizes=(16,)),
        rollout_length=7,
        total_steps=ROLLOUTS * 2 * 4 * 7,
        deterministic=True,
    )
    return replace(cfg, **changes)


def versions(cfg: TrainConfig, spec) -> list:
    """Params of versions 0..ROLLOUTS: different enough to change actions."""
    network = make_network(cfg.network, spec)
    first = network.init(jax.random.PRNGKey(0), np.zeros((1, *spec.obs_shape), np.float32))
    leaves, tree = jax.tree.flatten(first)
    out = []
    for v in range(ROLLOUTS + 1):
        keys = jax.random.split(jax.random.PRNGKey(100 + v), len(leaves))
        noisy = [x + 0.5 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
        out.append(jax.tree.unflatten(tree, noisy))
    return network, out


def learner(pipeline, publisher, params, consumed):
    def run():
        for version in range(ROLLOUTS):
            batch, _ = pipeline.next_batch(version)
            consumed.extend(batch)
            publisher.publish(params[version + 1])

    return run


def run_loops(lifetime, loops, consumed, actors):
    group = ThreadGroup(lifetime)
    for name, loop in loops:
        group.spawn(name, loop)
    try:
        wait_until(lambda: len(consumed) == ROLLOUTS * actors or lifetime.stopping, 120)
        if lifetime.failure is not None:
            raise lifetime.failure
    finally:
        lifetime.stop("test over")
        assert group.join(5.0) == []


def parts(cfg: TrainConfig, actors: int) -> tuple:
    """What both ways of stepping share: the env source and its spec, the network and its
    params' versions (the first published), a lifetime, metrics, a watchdog, the publisher
    and a pipeline for `actors` actors."""
    source = EnvSource(cfg.env)
    spec = source.spec()
    network, params = versions(cfg, spec)
    lifetime, metrics = Lifetime(), Metrics()
    watchdog = Watchdog(lifetime, 60)
    publisher = LocalPublisher()
    publisher.publish(params[0])
    pipeline = Pipeline(actors, 1, 0, lifetime)
    return source, spec, network, params, lifetime, metrics, watchdog, publisher, pipeline


def actor_loop_rollouts(cfg: TrainConfig, actors: int) -> list:
    source, spec, network, params, lifetime, metrics, watchdog, publisher, pipeline = parts(
        cfg, actors
    )
    fns = make_policy_fns(network.apply).on(jax.devices("cpu")[0])
    consumed: list = []
    built = []
    for a in range(actors):
        control = Control(lifetime, watchdog.heartbeat(f"actor-{a}"), metrics.add_many)
        sub = publisher.subscribe(device=fns.device, name=f"actor-{a}")
        actor = build_actor(cfg, a, fns, sub, pipeline, control, envs=source)
        actor.warm_up(params[0])
        built.append(actor)
    loops = [(f"actor-{a.actor_id}", a.run) for a in built]
    loops.append(("learner", learner(pipeline, publisher, params, consumed)))
    try:
        run_loops(lifetime, loops, consumed, actors)
    finally:
        for actor in built:
            actor.env.close()
    return consumed


def served_rollouts(cfg: TrainConfig, actors: int, workers: int) -> list:
    source, spec, network, params, lifetime, metrics, watchdog, publisher, pipeline = parts(
        cfg, actors
    )
    device = jax.devices("cpu")[0]
    consumed: list = []
    B = cfg.env.num_envs
    all_workers = []
    try:
        served = []
        for a in range(actors):
            seed = actor_env_seed(cfg, a)
            mine = [
                EnvWorker(f"a{a}.w{j}", source, spec, B, seed, part)
                for j, part in enumerate(split_envs(B, workers))
            ]
            all_workers += mine
            for worker in mine:
                worker.start()
            for worker in mine:
                worker.wait_started()
            control = Control(lifetime, watchdog.heartbeat(f"actor-{a}"), metrics.add_many)
            served.append(
                ServedActor(
                    actor_settings(cfg, a),
                    spec,
                    B,
                    mine,
                    pipeline,
                    control,
                    watchdog.heartbeat,
                    device,
                )
            )
        settings = ServerSettings(cfg.rollout_length, 0, fixed_order=True)
        control = Control(lifetime, watchdog.heartbeat("server"), metrics.add_many)
        server = InferenceServer(
            "server",
            settings,
            served,
            make_serve_fn(network.apply, B, B // workers),
            make_key_chain(cfg.rollout_length),
            device,
            control,
        )
        server.warm_up(params[0])
        publisher.add_push_target(server.push, "server")
        loops = [("server", server.run)] + [(f"actor-{a.actor_id}", a.run) for a in served]
        loops.append(("learner", learner(pipeline, publisher, params, consumed)))
        run_loops(lifetime, loops, consumed, actors)
        server.close()
    finally:
        publisher.close()
        for worker in all_workers:
            worker.close()
    return consumed


def assert_same(a, b, exact_floats: bool = True) -> None:
    assert (a.actor_id, a.seq, a.policy_version) == (b.actor_id, b.seq, b.policy_version)
    for field in a.trajectory._fields:
        x, y = np.asarray(getattr(a.trajectory, field)), np.asarray(getattr(b.trajectory, field))
        what = f"{field} of actor {a.actor_id} rollout {a.seq}"
        if exact_floats or field not in ("logprobs", "values", "last_value"):
            np.testing.assert_array_equal(x, y, err_msg=what)
        else:
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6, err_msg=what)
    np.testing.assert_array_equal(a.episode_returns, b.episode_returns)
    np.testing.assert_array_equal(a.episode_lengths, b.episode_lengths)


@pytest.mark.parametrize(
    "actors,workers", [(1, 2), (2, 2), (1, 4)], ids=["actor-2w", "server-2x2w", "actor-4w"]
)
def test_a_served_rollout_is_the_actor_loops(actors, workers):
    """One actor per server (`--layout.inference actor`) and two actors sharing one
    (`server`): the same rollouts as the actor loop's, episodes ending inside them (time
    limit 9 steps: truncation, autoreset steps marked invalid).

    One actor's parts make a batch of the actor loop's shape: bit for bit. Two actors'
    make one of twice as many rows, which XLA:CPU's matrix products round differently in
    the last bit: log-probs and values then agree to float32 rounding, and everything
    else (the actions sampled, hence every observation) exactly."""
    cfg = config()
    expected = actor_loop_rollouts(cfg, actors)
    got = served_rollouts(cfg, actors, workers)
    assert len(expected) == len(got) == ROLLOUTS * actors
    assert any(len(r.episode_returns) for r in expected)
    assert not all(np.asarray(r.trajectory.valid).all() for r in expected)
    for a, b in zip(expected, got):
        assert_same(a, b, exact_floats=actors == 1)
        assert (b.behaviour_versions == b.policy_version).all()
