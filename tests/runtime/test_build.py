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

        def make(self, num_envs, seed):
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
    keys = {tuple(np.asarray(jax.random.key_data(a.key)).ravel().tolist()) for a in actors}
    assert len(keys) == 3
    # Reproducible: the same run seed and actor id give the same seed and key.
    again = actor(cfg, 1)
    assert made_envs[-1] == made_envs[1]
    np.testing.assert_array_equal(np.asarray(jax.random.key_data(again.key)), np.asarray(jax.random.key_data(actors[1].key)))


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
