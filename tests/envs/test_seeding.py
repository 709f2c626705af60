"""A seed fixes every env; different seeds (and different envs of one batch) differ."""

import numpy as np
import pytest

from podrace.config import EnvConfig
from podrace.envs import env_seeds

CASES = [
    ("CartPole-v1", "envpool", 2),
    ("CartPole-v1", "gymnasium", 2),
    ("Breakout-v5", "envpool", 4),
]


def rollout(env, num_actions: int, num_steps: int):
    actions = np.random.default_rng(0).integers(0, num_actions, (num_steps, env.num_envs))
    obs = [env.reset()]
    rewards = []
    for a in actions:
        step = env.step(a.astype(np.int32))
        obs.append(step.obs)
        rewards.append(step.reward)
    return np.stack(obs), np.stack(rewards)


@pytest.mark.parametrize("env_id,backend,num_actions", CASES)
def test_same_seed_same_run_other_seed_differs(make, env_id, backend, num_actions):
    cfg = EnvConfig(id=env_id, backend=backend)
    steps = 40 if env_id == "Breakout-v5" else 60  # CartPole: several autoresets on the way
    obs_a, rew_a = rollout(make(cfg, 3, seed=7), num_actions, steps)
    obs_b, rew_b = rollout(make(cfg, 3, seed=7), num_actions, steps)
    obs_c, _ = rollout(make(cfg, 3, seed=8), num_actions, steps)
    np.testing.assert_array_equal(obs_a, obs_b)
    np.testing.assert_array_equal(rew_a, rew_b)
    assert not np.array_equal(obs_a, obs_c)
    if env_id == "CartPole-v1":  # envs of one batch start from different states
        assert len({o.tobytes() for o in obs_a[0]}) == 3


def test_env_seeds_are_distinct_across_neighbouring_run_seeds():
    seeds = env_seeds(1, 8) + env_seeds(2, 8)
    assert len(set(seeds)) == 16 and all(0 <= s < 2**31 for s in seeds)
    assert env_seeds(1, 8) == env_seeds(1, 8)
