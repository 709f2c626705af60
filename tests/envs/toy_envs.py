"""Tiny Gymnasium envs for the env tests (fast, fully predictable episodes), registered on
import."""

from __future__ import annotations

import gymnasium
import numpy as np

COUNTER_ID = "podrace-test/Counter-v0"
ECHO_ID = "podrace-test/Echo-v0"
COUNTER_TIME_LIMIT = 5
COUNTER_TERMINAL_SUM = 3


class CounterEnv(gymnasium.Env):
    """obs = [steps taken, sum of actions]; reward = 1 + 2 * action.

    Terminates once the actions sum to COUNTER_TERMINAL_SUM, so all-ones episodes end
    terminated after 3 steps and all-zeros episodes are truncated by the time limit.
    """

    observation_space = gymnasium.spaces.Box(0.0, np.inf, (2,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t, self._sum = 0, 0
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        self._sum += int(action)
        return self._obs(), 1.0 + 2.0 * int(action), self._sum >= COUNTER_TERMINAL_SUM, False, {}

    def _obs(self):
        return np.array([self._t, self._sum], np.float32)


class EchoEnv(gymnasium.Env):
    """Continuous actions in [-1, 1]^2; the obs is the action the env received."""

    observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        action = np.asarray(action, np.float32)
        return action.copy(), float(action.sum()), False, False, {}


if COUNTER_ID not in gymnasium.registry:
    gymnasium.register(COUNTER_ID, entry_point=CounterEnv, max_episode_steps=COUNTER_TIME_LIMIT)
if ECHO_ID not in gymnasium.registry:
    gymnasium.register(ECHO_ID, entry_point=EchoEnv, max_episode_steps=4)
