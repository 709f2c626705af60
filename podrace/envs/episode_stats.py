"""Per-env running episode return and length, kept on our side of the backend.

Wrapper-free backends (raw envpool, a bare Gymnasium vector env) report no episode
statistics, and for Atari with episodic life the *learning* episode (one life) is shorter
than the *reported* one (one game), so the adapter counts for itself. The counting is one
function over NumPy or jax.numpy arrays: the host adapters call it per step, a rollout
compiled into one XLA call (`podrace.fused_rollout`) calls it inside its loop.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


class EpisodeCounts(NamedTuple):
    """Return and length of the current reported episode of each env, and two flags:
    `autoreset` (this env's next step is a reset, not counted) and `new_episode` (the last
    step ended a reported episode: counts restart at the next one)."""

    returns: Any
    lengths: Any
    autoreset: Any
    new_episode: Any


def zero_counts(
    num_envs: int, float_dtype: Any = np.float64, int_dtype: Any = np.int64
) -> EpisodeCounts:
    """NumPy counts for envs that were all just reset (a jitted rollout takes JAX's 32-bit
    types, placed on its device)."""
    zeros = np.zeros(num_envs, bool)
    return EpisodeCounts(
        np.zeros(num_envs, float_dtype), np.zeros(num_envs, int_dtype), zeros, zeros.copy()
    )


def count_step(
    counts: EpisodeCounts,
    raw_reward: Any,
    terminated: Any,
    truncated: Any,
    episode_done: Any,
    xp: Any = np,
) -> tuple[EpisodeCounts, Any, Any]:
    """Account one step: (new counts, episode_return, episode_length), zero where not done.

    Length counts real transitions only: the autoreset steps (after any terminated or
    truncated step, including a lost life) ignore their action and are not counted.
    """
    returns = xp.where(counts.new_episode, 0, counts.returns) + raw_reward
    lengths = xp.where(counts.new_episode, 0, counts.lengths) + ~counts.autoreset
    done = episode_done.astype(bool)
    counts = EpisodeCounts(returns, lengths, terminated | truncated, done)
    return counts, xp.where(done, returns, 0), xp.where(done, lengths, 0)


class EpisodeStats:
    """`count_step` with its state kept, for host adapters."""

    def __init__(
        self, num_envs: int, float_dtype: Any = np.float64, int_dtype: Any = np.int64
    ) -> None:
        """`float_dtype`/`int_dtype`: what the counts accumulate in (an adapter whose
        rollouts may also be compiled counts in JAX's 32-bit types, so both agree bit for bit)."""
        self._num_envs = num_envs
        self._dtypes = (float_dtype, int_dtype)
        self._counts = zero_counts(num_envs, *self._dtypes)

    def reset(self) -> None:
        """All envs were reset explicitly: every count restarts."""
        self._counts = zero_counts(self._num_envs, *self._dtypes)

    def update(
        self,
        raw_reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        episode_done: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Account one step; returns (episode_return, episode_length), zero where not done."""
        self._counts, episode_return, episode_length = count_step(
            self._counts, raw_reward, terminated, truncated, np.asarray(episode_done)
        )
        return episode_return.astype(np.float64), episode_length.astype(np.int64)
