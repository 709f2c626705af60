"""A stored policy played on the host, outside training (`podrace eval`): observations in,
actions out (the policy's mode, or a sample), a recurrent core's state carried from step to
step, and episodes played until every env has finished its share."""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np

from podrace.algos.base import RecurrentApply, is_recurrent
from podrace.envs import BatchedEnv
from podrace.evaluate import EpisodeTally


def make_actor(
    apply_fn: Callable, params, stochastic: bool, seed: int
) -> Callable[[np.ndarray], np.ndarray]:
    """obs (host) -> actions (host): the policy's mode, or a sample with its own key stream.
    A recurrent network's is a `RecurrentActor`, which carries its core's state."""
    device = jax.devices()[0]
    params = jax.device_put(params, device)
    if is_recurrent(apply_fn):
        return RecurrentActor(apply_fn, params, stochastic, seed, device)

    @jax.jit
    def act(params, obs, key):
        dist = apply_fn(params, obs)[0]
        key, sample_key = jax.random.split(key)
        return (dist.sample(sample_key) if stochastic else dist.mode()), key

    state = {"key": jax.device_put(jax.random.PRNGKey(seed), device)}

    def policy(obs: np.ndarray) -> np.ndarray:
        action, state["key"] = act(params, jax.device_put(obs, device), state["key"])
        return np.asarray(jax.device_get(action))

    return policy


class RecurrentActor:
    """A recurrent policy on the host's side: `actor(obs, valid=None) -> actions`, its core's
    state carried from call to call, from the initial state at the first call. `valid` [B]
    is False where the step is an autoreset (the last step ended an episode; None: every
    step valid, as within one recorded episode), so the core resets as in training."""

    def __init__(self, apply_fn: RecurrentApply, params, stochastic: bool, seed: int, device):
        @jax.jit
        def act(params, obs, valid, core, key):
            dist, _, states = apply_fn(params, obs[None], valid[None], core)
            dist = jax.tree.map(lambda x: x[0], dist)
            key, sample_key = jax.random.split(key)
            action = dist.sample(sample_key) if stochastic else dist.mode()
            return action, jax.tree.map(lambda x: x[0], states), key

        self._act, self._params, self._device = act, params, device
        self._initial_state = apply_fn.initial_state
        self._key = jax.device_put(jax.random.PRNGKey(seed), device)
        self._core = None

    def __call__(self, obs: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
        if self._core is None:
            self._core = jax.device_put(self._initial_state(len(obs)), self._device)
        valid = np.ones(len(obs), bool) if valid is None else valid
        placed = jax.device_put((obs, valid), self._device)
        action, self._core, self._key = self._act(self._params, *placed, self._core, self._key)
        return np.asarray(jax.device_get(action))


def play_episodes(
    env: BatchedEnv, policy: Callable, episodes: int, time_limit: int | None = None
) -> EpisodeTally:
    """`episodes` episodes, each env its own share: the complete `EpisodeTally`."""
    tally = EpisodeTally(episodes, env.num_envs, time_limit)
    obs = env.reset()
    valid = np.ones(env.num_envs, bool)
    while not tally.complete:
        action = policy(obs, valid) if isinstance(policy, RecurrentActor) else policy(obs)
        step = env.step(action)
        tally.add(step.episode_done, step.episode_return, step.episode_length)
        obs, valid = step.obs, ~(step.terminated | step.truncated)
    return tally


__all__ = ["RecurrentActor", "make_actor", "play_episodes"]
