"""The factories every topology calls: seeds and keys derive from (run seed, stream, id)."""

import jax
import numpy as np
import pytest

from podrace.config import TrainConfig
from podrace.control import Control, Heartbeat, Lifetime
from podrace.runtime import build


class FakeEnv:
    num_envs = 2

    def __init__(self, seed):
        self.seed = seed


@pytest.fixture
def made_envs(monkeypatch):
    seeds = []

    class FakeSource:
        """Stands in for the EnvSource the factories build envs through."""

        def make(self, num_envs, seed, threads=None):
            seeds.append(seed)
            return FakeEnv(seed)

    monkeypatch.setattr(build, "EnvSource", lambda env_cfg, factory=None: FakeSource())
    return seeds


def actor(cfg, actor_id):
    control = Control(Lifetime(), Heartbeat(f"actor-{actor_id}"), lambda metrics: None)
    return build.build_actor(cfg, actor_id, policy=_Policy(), params=None, out=None, control=control)


class _Policy:
    device = None


@pytest.mark.timeout(60)
def test_every_actor_gets_its_own_env_seed_and_policy_key(made_envs):
    cfg = TrainConfig()
    actors = [actor(cfg, i) for i in range(3)]
    assert len(set(made_envs)) == 3
    keys = {tuple(np.asarray(a.key).ravel().tolist()) for a in actors}
    assert len(keys) == 3
    # Reproducible: the same run seed and actor id give the same seed and key.
    again = actor(cfg, 1)
    assert made_envs[-1] == made_envs[1]
    np.testing.assert_array_equal(np.asarray(again.key), np.asarray(actors[1].key))


@pytest.mark.timeout(60)
def test_the_evaluator_envs_are_seeded_apart_from_every_actor(made_envs):
    cfg = TrainConfig()
    for i in range(2):
        actor(cfg, i)
    control = Control(Lifetime(), Heartbeat("evaluator"), lambda metrics: None)
    from podrace.metrics.registry import Metrics

    build.build_evaluator(cfg, greedy=None, device=None, params=None, metrics=Metrics(), control=control)
    assert len(set(made_envs)) == 3


@pytest.mark.timeout(60)
def test_seeds_change_with_the_run_seed(made_envs):
    from podrace.config import replace

    actor(TrainConfig(), 0)
    actor(replace(TrainConfig(), seed=TrainConfig().seed + 1), 0)
    assert made_envs[0] != made_envs[1]


@pytest.mark.timeout(60)
def test_envpool_threads_share_the_cores_after_one_for_the_learner(monkeypatch):
    import os

    from podrace.config import replace
    from podrace.envs import EnvSource

    cfg = TrainConfig()
    for cores, actors, expected in ((2, 1, 1), (2, 2, 1), (1, 1, 1), (16, 2, 7), (16, 1, 15)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)))
        assert build.env_threads(replace(cfg, **{"layout.actors_per_device": actors})) == expected, (cores, actors)
    assert build.env_threads(replace(cfg, **{"env.num_threads": 3})) == 3  # the user's count wins
    assert build.env_threads(replace(cfg, runtime="ray")) is None  # Ray workers: envpool's default
    for source, threads, expected in ((EnvSource(cfg.env), 1, 1), (EnvSource(replace(cfg, **{"env.num_threads": 2}).env), 1, 2)):
        env = source.make(4, 0, threads)
        try:
            assert env._env.config["num_threads"] == expected
        finally:
            env.close()
