"""Data that moves between components. Containers only, no logic.

Autoreset convention (both env backends): *next-step*. When step t ends an episode
(terminated or truncated), the observation returned is the final observation of that
episode; the following step t+1 resets the env, ignores its action, and returns the first
observation of the next episode with reward 0. Step t+1 is therefore not a real
transition and is marked `valid = False`. The behaviour value the actor computed at step
t+1 is V(final observation), which is exactly the bootstrap value a truncated step t needs,
so truncation is bootstrapped with no extra forward pass.

A recurrent policy's core state follows the same mask: the state after an invalid step is
the initial state, so the first step of each new episode (the step after the autoreset
step) starts from it (`podrace.networks.recurrent.reset_after_invalid`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

PyTree = Any


class EnvSpec(NamedTuple):
    """Shapes and dtypes of one environment (not batched)."""

    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    num_actions: int | None
    """Discrete action count, or None for continuous actions."""
    action_shape: tuple[int, ...]
    """() for discrete actions, (A,) for continuous ones."""
    action_low: np.ndarray | None = None
    action_high: np.ndarray | None = None

    @property
    def discrete(self) -> bool:
        return self.num_actions is not None


class EnvStep(NamedTuple):
    """One batched env step, host NumPy arrays with leading dim = num_envs."""

    obs: np.ndarray
    reward: np.ndarray
    """float32 reward used for learning (clipped for Atari when configured)."""
    terminated: np.ndarray
    """bool: the episode reached a terminal state (no bootstrap)."""
    truncated: np.ndarray
    """bool: the episode was cut by a time limit (bootstrap from the final obs)."""
    episode_done: np.ndarray
    """bool: a whole reported episode ended here (for Atari with episodic life: game over)."""
    episode_return: np.ndarray
    """float64 raw (unclipped) return of the episode ending here; valid where episode_done."""
    episode_length: np.ndarray
    """int: length in agent steps of the episode ending here; valid where episode_done."""


class Trajectory(NamedTuple):
    """A rollout of T steps x B envs, time-major, as JAX arrays (a pytree)."""

    obs: Any  # [T, B, *obs_shape]
    actions: Any  # [T, B] int32 or [T, B, A] float32
    logprobs: Any  # [T, B] behaviour log-probabilities of `actions`
    values: Any  # [T, B] behaviour values V(obs)
    rewards: Any  # [T, B] float32
    terminated: Any  # [T, B] bool
    truncated: Any  # [T, B] bool
    valid: Any  # [T, B] bool, False on autoreset steps
    last_obs: Any  # [B, *obs_shape] observation after the last step
    last_value: Any  # [B] behaviour value of last_obs
    core_state: Any = ()
    """A recurrent policy's core state before the first step ([B, ...] per leaf; the state
    that step starts from, reset already where it begins an episode); () for a feed-forward
    policy (no leaves)."""


@dataclass(frozen=True)
class Rollout:
    """A Trajectory stamped with where and from which policy it came."""

    actor_id: int
    seq: int
    """Rollout number of this actor, from 0; rollout `seq` feeds learner update `seq`."""
    policy_version: int
    """Params version that chose every action of this rollout."""
    trajectory: Trajectory
    """Arrays on the actor's device (or host), as the actor made them; the learner side
    places them on its mesh (in this process: `pipeline.PlacingSink`)."""
    episode_returns: np.ndarray
    """Raw returns of episodes that ended during the rollout (host)."""
    episode_lengths: np.ndarray
    timings: dict[str, float]
    """Seconds spent per actor stage for this rollout (env_step, inference, ...)."""
    restart: int = 0
    """Incarnation of the actor that made it (restarts of that Ray worker before it): with
    actor_id and seq a stamp no two consumed rollouts share."""
    behaviour_versions: np.ndarray | None = None
    """[T, B] the params version that chose each action (host), where the steps of one
    rollout may span versions (an inference server acts with the newest params it has);
    `policy_version` is then the oldest of them. None: every step is `policy_version`'s."""
    episode_info: dict[str, np.ndarray] | None = None
    """key -> the values the env reported in `info[key]` as each episode of this rollout
    ended (host; `BatchedEnv`s that keep them); None: the env keeps none."""


class JaxEnvStep(NamedTuple):
    """One env step inside a jitted rollout, as envpool's XLA step and a JAX env's step
    return it (the fields `podrace.fused_rollout` reads; episode statistics are counted
    there)."""

    obs: Any
    reward: Any
    terminated: Any
    truncated: Any
    raw_reward: Any
    episode_done: Any
