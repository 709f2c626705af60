"""Gymnasium adapter: a synchronous vector env in next-step autoreset mode.

Gymnasium's NEXT_STEP mode matches podrace's convention (the step after a done one
resets, ignores its action and reports reward 0, terminated/truncated False). The Atari
settings of EnvConfig do not apply here.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

from podrace.config import ConfigError, EnvConfig
from podrace.envs.base import env_seeds
from podrace.envs.episode_stats import EpisodeStats
from podrace.envs.spaces import ActionPreparer, spec_from_spaces
from podrace.types import EnvSpec, EnvStep


def make_kwargs(cfg: EnvConfig) -> dict[str, Any]:
    """gymnasium.make keyword arguments: only the time-limit override applies."""
    if cfg.max_episode_steps is None:
        return {}
    if cfg.max_episode_steps <= 0:
        raise ConfigError(f"env.max_episode_steps must be positive, got {cfg.max_episode_steps}")
    return {"max_episode_steps": cfg.max_episode_steps}


def gymnasium_spec(cfg: EnvConfig) -> EnvSpec:
    """EnvSpec read from one throwaway env instance."""
    env = gymnasium.make(cfg.id, **make_kwargs(cfg))
    try:
        return spec_from_spaces(cfg.id, env.observation_space, env.action_space)
    finally:
        env.close()


class GymnasiumEnv:
    """BatchedEnv over `gymnasium.vector.SyncVectorEnv`."""

    def __init__(self, cfg: EnvConfig, num_envs: int, seed: int) -> None:
        self._env = gymnasium.make_vec(
            cfg.id,
            num_envs=num_envs,
            vectorization_mode="sync",
            # copy=True: the vector env returns a new obs array each step, never its buffer.
            vector_kwargs={"autoreset_mode": gymnasium.vector.AutoresetMode.NEXT_STEP, "copy": True},
            **make_kwargs(cfg),
        )
        assert self._env.metadata["autoreset_mode"] == gymnasium.vector.AutoresetMode.NEXT_STEP
        self.num_envs = num_envs
        self.spec = spec_from_spaces(
            cfg.id, self._env.single_observation_space, self._env.single_action_space
        )
        self._prepare = ActionPreparer(self.spec, num_envs, self._env.single_action_space.dtype)
        self._seeds: list[int] | None = env_seeds(seed, num_envs)
        self._stats = EpisodeStats(num_envs)
        self._started = False
        self._closed = False

    def reset(self) -> np.ndarray:
        # Seed only the first reset; later resets continue each env's random stream.
        obs, _ = self._env.reset(seed=self._seeds)
        self._seeds = None
        self._stats.reset()
        self._started = True
        return obs

    def step(self, actions: np.ndarray) -> EnvStep:
        if not self._started:
            raise RuntimeError("call reset() before step()")
        obs, reward, terminated, truncated, _ = self._env.step(self._prepare(actions))
        terminated = np.asarray(terminated, bool)
        truncated = np.asarray(truncated, bool)
        episode_done = terminated | truncated
        episode_return, episode_length = self._stats.update(
            reward, terminated, truncated, episode_done
        )
        return EnvStep(
            obs=obs,
            reward=np.asarray(reward, np.float32),
            terminated=terminated,
            truncated=truncated,
            episode_done=episode_done,
            episode_return=episode_return,
            episode_length=episode_length,
        )

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._env.close()
