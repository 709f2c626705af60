"""Per-env running episode return and length, kept on our side of the backend.

Wrapper-free backends (raw envpool, a bare Gymnasium vector env) report no episode
statistics, and for Atari with episodic life the *learning* episode (one life) is shorter
than the *reported* one (one game), so the adapter counts for itself.
"""

from __future__ import annotations

import numpy as np


class EpisodeStats:
    """Raw return and length of the current reported episode of each env.

    Length counts real transitions only: the autoreset steps (after any terminated or
    truncated step, including a lost life) ignore their action and are not counted.
    """

    def __init__(self, num_envs: int) -> None:
        self._returns = np.zeros(num_envs, np.float64)
        self._lengths = np.zeros(num_envs, np.int64)
        self._autoreset = np.zeros(num_envs, bool)
        self._new_episode = np.zeros(num_envs, bool)

    def reset(self) -> None:
        """All envs were reset explicitly: every count restarts."""
        self._returns[:] = 0.0
        self._lengths[:] = 0
        self._autoreset[:] = False
        self._new_episode[:] = False

    def update(
        self,
        raw_reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        episode_done: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Account one step; returns (episode_return, episode_length), zero where not done."""
        self._returns[self._new_episode] = 0.0
        self._lengths[self._new_episode] = 0
        self._returns += raw_reward
        self._lengths += ~self._autoreset
        self._autoreset = terminated | truncated
        self._new_episode = np.asarray(episode_done, bool)
        return (
            np.where(self._new_episode, self._returns, 0.0),
            np.where(self._new_episode, self._lengths, 0),
        )
