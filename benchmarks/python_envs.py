"""Pure-Python envs whose step costs more than classic control's, for `served.py`.

A user's own env (a game, a simulator written in Python) usually spends far longer per step
than CartPole (~10 us) or Acrobot (~25 us): that is where env workers pay. `AcrobotSubsteps`
is Gymnasium's Acrobot integrated in `substeps` RK4 steps of `dt / substeps` per env step
(the same dynamics, integrated more finely), so its step costs about `substeps` times
Acrobot's. Registered as `AcrobotSubsteps4-v1` and `AcrobotSubsteps16-v1` (500 steps per
episode, as Acrobot-v1); from the command line:

    podrace train cartpole-ppo --env.backend gymnasium \\
        --env.id benchmarks.python_envs:AcrobotSubsteps4-v1
"""

from __future__ import annotations

import gymnasium
from gymnasium.envs.classic_control.acrobot import AcrobotEnv


class AcrobotSubsteps(AcrobotEnv):
    """Acrobot, each env step integrated in `substeps` RK4 steps of `dt / substeps`."""

    def __init__(self, substeps: int = 4, render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode)
        self.substeps = substeps
        self.dt = AcrobotEnv.dt / substeps

    def step(self, action):
        for _ in range(self.substeps):
            obs, reward, terminated, truncated, info = super().step(action)
            if terminated:
                break
        return obs, reward, terminated, truncated, info


for _substeps in (4, 16):
    gymnasium.register(
        f"AcrobotSubsteps{_substeps}-v1",
        entry_point=AcrobotSubsteps,
        max_episode_steps=500,
        kwargs={"substeps": _substeps},
    )
