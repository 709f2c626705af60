"""A user's JAX envs, as a podrace user would write them for `--env.id module:factory`.

`Guess` implements gymnax's Environment interface by duck typing (no gymnax import, as
Craftax's envs do): each episode hides a number in [0, 4) drawn at reset, the obs shows a
noisy hint of it, a right guess pays 1 and ends the episode, a wrong one pays 0; an episode
is cut after `max_steps_in_episode` steps (state.time, gymnax's time limit). Episodes end at
different steps in different envs, so rollouts cross many autoresets.

The other factories are the bad inputs podrace must stop with one line.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

CLASSES = 4


@struct.dataclass
class GuessState:
    secret: jax.Array
    time: jax.Array


@struct.dataclass
class GuessParams:
    max_steps_in_episode: int = 5


class Discrete:
    def __init__(self, n: int) -> None:
        self.n = n


class Box:
    def __init__(self, low: Any, high: Any, shape: tuple, dtype: Any) -> None:
        self.low, self.high, self.shape, self.dtype = low, high, shape, dtype


class Guess:
    @property
    def default_params(self) -> GuessParams:
        return GuessParams()

    def reset_env(self, key, params):
        secret = jax.random.randint(key, (), 0, CLASSES)
        state = GuessState(secret, jnp.zeros((), jnp.int32))
        return self._obs(key, state), state

    def step_env(self, key, state, action, params):
        right = action == state.secret
        state = GuessState(state.secret, state.time + 1)
        done = right | (state.time >= params.max_steps_in_episode)
        return self._obs(key, state), state, right.astype(jnp.float32), done, {}

    def _obs(self, key, state):
        hint = jax.nn.one_hot(state.secret, CLASSES)
        return hint + 0.5 * jax.random.normal(key, (CLASSES,))

    def observation_space(self, params):
        return Box(-jnp.inf, jnp.inf, (CLASSES,), jnp.float32)

    def action_space(self, params):
        return Discrete(CLASSES)


RESETS: list[int] = []
"""One entry per env reset `CountedGuess` computed."""


class CountedGuess(Guess):
    """Guess whose every env reset calls back to the host, to count the resets computed."""

    def reset_env(self, key, params):
        jax.debug.callback(lambda _: RESETS.append(1), key)
        return super().reset_env(key, params)


class Unjittable(Guess):
    """Branches in Python on a traced value: its step cannot be jitted."""

    def step_env(self, key, state, action, params):
        if action == state.secret:
            return self._obs(key, state), state, 1.0, True, {}
        return self._obs(key, state), state, 0.0, False, {}


def guess():
    env = Guess()
    return env, env.default_params


def counted_guess():
    env = CountedGuess()
    return env, env.default_params


def guess_only_env():
    return Guess()


def not_an_env():
    return object(), GuessParams()


def unjittable():
    return Unjittable(), GuessParams()
