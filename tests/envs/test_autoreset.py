"""Next-step autoreset, terminated vs truncated, and episode statistics on both backends."""

import numpy as np
import pytest

from podrace.config import EnvConfig

from .contract import run_checked
from .toy_envs import COUNTER_ID, COUNTER_TERMINAL_SUM, COUNTER_TIME_LIMIT


def balance_or_fall(obs: np.ndarray, t: int) -> np.ndarray:
    """Envs 0-1 balance the pole (outlive any small time limit); envs 2-3 push left and fall."""
    balance = (obs[:, 2] + obs[:, 3] > 0).astype(np.int32)
    return np.where(np.arange(len(obs)) < 2, balance, 0).astype(np.int32)


@pytest.mark.parametrize("backend", ["envpool", "gymnasium"])
def test_cartpole_terminated_truncated_and_stats(make, backend):
    env = make(EnvConfig(id="CartPole-v1", backend=backend, max_episode_steps=20), 4, seed=1)
    rec = run_checked(env, balance_or_fall, 90)
    assert rec.terminated > 0 and rec.truncated > 0
    # Truncation comes only from the time limit and only to the balancing envs.
    for step in rec.steps:
        assert not step.truncated[2:].any() and not step.terminated[:2].any()
    assert {length for i, _, length in rec.episodes if i < 2} == {20}
    assert all(length < 20 for i, _, length in rec.episodes if i >= 2)
    # CartPole returns 1 per real step.
    assert all(ret == length for _, ret, length in rec.episodes)
    # A fresh CartPole state lies in [-0.05, 0.05]^4; terminal states never do.
    assert rec.reset_obs and all(np.abs(o).max() <= 0.05 for o in rec.reset_obs)


def test_gymnasium_toy_env_autoreset_ignores_action(make):
    """All-ones episodes terminate after 3 steps, all-zeros ones are truncated at the limit;
    the autoreset step's action (1 here) must not count towards the next episode."""
    env = make(EnvConfig(id=COUNTER_ID, backend="gymnasium"), 2)
    rec = run_checked(env, lambda obs, t: np.array([1, 0], np.int32), 13)
    env0 = [t for t, s in enumerate(rec.steps) if s.terminated[0] or s.truncated[0]]
    env1 = [t for t, s in enumerate(rec.steps) if s.terminated[1] or s.truncated[1]]
    # Episodes of 3 (env 0) and 5 (env 1) steps, each followed by one autoreset step.
    assert env0 == [2, 6, 10] and all(rec.steps[t].terminated[0] for t in env0)
    assert env1 == [4, 10] and all(rec.steps[t].truncated[1] for t in env1)
    assert sorted(rec.episodes) == sorted(
        [(0, 3.0 * COUNTER_TERMINAL_SUM, COUNTER_TERMINAL_SUM)] * 3
        + [(1, 1.0 * COUNTER_TIME_LIMIT, COUNTER_TIME_LIMIT)] * 2
    )
    # Fresh obs after every autoreset: zero steps taken, zero action sum.
    assert all((o == 0).all() for o in rec.reset_obs)
    # The step after an autoreset is the first real step: [1, 1] for env 0.
    np.testing.assert_array_equal(rec.steps[4].obs[0], [1, 1])


@pytest.mark.parametrize("backend", ["envpool", "gymnasium"])
def test_explicit_reset_restarts_statistics(make, backend):
    env = make(EnvConfig(id="CartPole-v1", backend=backend), 2, seed=0)
    env.reset()
    for _ in range(5):
        env.step(np.zeros(2, np.int32))
    env.reset()
    length = None
    for t in range(1, 200):  # noqa: B007 - t is the episode's length once it breaks
        step = env.step(np.zeros(2, np.int32))
        if step.episode_done[0]:
            length = step.episode_length[0]
            break
    assert length == t
