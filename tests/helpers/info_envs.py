"""A Gymnasium env that reports a value in its `info` at the end of every episode (as Sample
Factory's "true objective"), and an env factory of it."""

from __future__ import annotations

import gymnasium

OFFSET = 1000.0
"""`true_objective` is OFFSET + the episode's length: far from any CartPole return."""


class TrueObjective(gymnasium.Wrapper):
    """CartPole-v1 whose last step of an episode reports info["true_objective"]."""

    def __init__(self) -> None:
        super().__init__(gymnasium.make("CartPole-v1"))
        self.steps = 0

    def reset(self, **kwargs):
        self.steps = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        if terminated or truncated:
            info = {**info, "true_objective": OFFSET + self.steps}
        return obs, reward, terminated, truncated, info


def true_objective_envs(num_envs: int, seed: int) -> gymnasium.vector.VectorEnv:
    """An env factory: `num_envs` TrueObjective envs in one SyncVectorEnv."""
    return gymnasium.vector.SyncVectorEnv([TrueObjective for _ in range(num_envs)])
