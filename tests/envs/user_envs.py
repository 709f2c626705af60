"""A user's env module, as a podrace user would write it: an env class and its registration.

MatchEnv is a tiny task that a random policy does badly and PPO learns in a few thousand
steps: each step shows one of 4 classes (one-hot) and pays 1 for naming it.
"""

from __future__ import annotations

import gymnasium
import numpy as np

MATCH_ID = "podrace-user/Match-v0"
MATCH_CLASSES = 4
MATCH_LENGTH = 8
RANDOM_RETURN = MATCH_LENGTH / MATCH_CLASSES
"""Expected return of a uniformly random policy."""


class MatchEnv(gymnasium.Env):
    """obs: one-hot class; action: a class; reward 1 on a match; ends after MATCH_LENGTH steps."""

    observation_space = gymnasium.spaces.Box(0.0, 1.0, (MATCH_CLASSES,), np.float32)
    action_space = gymnasium.spaces.Discrete(MATCH_CLASSES)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._draw(), {}

    def step(self, action):
        reward = float(int(action) == self._class)
        self._t += 1
        return self._draw(), reward, self._t >= MATCH_LENGTH, False, {}

    def _draw(self) -> np.ndarray:
        self._class = int(self.np_random.integers(MATCH_CLASSES))
        return np.eye(MATCH_CLASSES, dtype=np.float32)[self._class]


if MATCH_ID not in gymnasium.registry:
    gymnasium.register(MATCH_ID, entry_point=MatchEnv)


class NoFrames(MatchEnv):
    """Takes render_mode but renders nothing (render() gives None)."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def render(self):
        return None


class ConstantEnv(gymnasium.Env):
    """CartPole's spaces, a different game: 0.5 per step, every episode CONSTANT_LENGTH steps,
    so its episode return (CONSTANT_RETURN) tells which envs a run played."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action):
        self._t += 1
        return np.zeros(4, np.float32), 0.5, self._t >= CONSTANT_LENGTH, False, {}


CONSTANT_LENGTH = 3
CONSTANT_RETURN = 0.5 * CONSTANT_LENGTH


def constant_envs(num_envs: int, seed: int) -> gymnasium.vector.VectorEnv:
    """An env factory a run can record and a later command import: `podrace.train(cfg,
    env_factory=constant_envs)`."""
    return gymnasium.vector.SyncVectorEnv([ConstantEnv] * num_envs)
