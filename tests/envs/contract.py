"""Steps a BatchedEnv and checks every step against the next-step autoreset contract,
counting each episode's return and length by hand."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from podrace.envs import BatchedEnv
from podrace.types import EnvStep


@dataclass
class Record:
    steps: list[EnvStep] = field(default_factory=list)
    terminated: int = 0
    truncated: int = 0
    episodes: list[tuple[int, float, int]] = field(default_factory=list)
    """(env index, return, length) of every reported episode, as counted by hand."""
    reset_obs: list[np.ndarray] = field(default_factory=list)
    """Obs returned by autoreset steps (first obs of an episode)."""


def run_checked(
    env: BatchedEnv,
    policy: Callable[[np.ndarray, int], np.ndarray],
    num_steps: int,
    raw_reward: Callable[[int, EnvStep], np.ndarray] | None = None,
    episode_is_life: bool = True,
) -> Record:
    """Run `num_steps` steps from a reset; assert the contract on each; return what happened.

    raw_reward(t, step) gives the unclipped reward of step t (default: step.reward).
    episode_is_life: the reported episode ends exactly when terminated or truncated
    (False for Atari with episodic life, where it ends only at game over).
    """
    n, spec = env.num_envs, env.spec
    obs = env.reset()
    assert obs.shape == (n, *spec.obs_shape) and obs.dtype == spec.obs_dtype
    rec = Record()
    manual_return = np.zeros(n)
    manual_length = np.zeros(n, np.int64)
    autoreset = np.zeros(n, bool)
    for t in range(num_steps):
        step = env.step(policy(obs, t))
        rec.steps.append(step)
        obs = step.obs
        assert obs.shape == (n, *spec.obs_shape) and obs.dtype == spec.obs_dtype
        assert step.reward.dtype == np.float32 and step.reward.shape == (n,)
        for flag in (step.terminated, step.truncated, step.episode_done):
            assert flag.dtype == np.bool_ and flag.shape == (n,)
        assert not (step.terminated & step.truncated).any(), "terminated and truncated overlap"
        done = step.terminated | step.truncated
        assert not (step.episode_done & ~done).any(), "episode_done without terminated/truncated"
        if episode_is_life:
            np.testing.assert_array_equal(step.episode_done, done)
        # Autoreset steps: reward 0, not done, first obs of the next episode.
        assert (step.reward[autoreset] == 0).all()
        assert not done[autoreset].any()
        rec.reset_obs.extend(obs[autoreset])
        raw = step.reward if raw_reward is None else raw_reward(t, step)
        manual_return += raw
        manual_length += ~autoreset
        for i in np.flatnonzero(step.episode_done):
            assert step.episode_return[i] == manual_return[i], (t, i)
            assert step.episode_length[i] == manual_length[i], (t, i)
            rec.episodes.append((int(i), float(manual_return[i]), int(manual_length[i])))
            manual_return[i] = 0.0
            manual_length[i] = 0
        rec.terminated += int(step.terminated.sum())
        rec.truncated += int(step.truncated.sum())
        autoreset = done
    return rec
