"""A recurrent core (LSTM or GRU) between torso and heads, and the one rule that resets its state.

The reset rule. Autoreset is next-step (`podrace.types`): when step t ends an episode
(terminated or truncated), step t+1 acts on that episode's final observation and is invalid
(the env resets and ignores its action), and step t+2 acts on the first observation of the
next episode. The core's state after an invalid step is the initial (zero) state. So step
t+1 still has the ending episode's memory (its value is V(final obs | episode), the bootstrap
a truncated step t needs) and step t+2, the first of the new episode, starts from the
initial state, as the first step after `env.reset()` does.

`reset_after_invalid` is that rule, and it runs in one place only: inside the core's scan
(`ResettingCore`). Actors (a step per call, or scanned in a compiled rollout), the evaluator
and the learners (a whole rollout per call) all run this module with the trajectory's
`valid` mask, so they reset at the same steps. Because the state an actor carries from one
step to the next is already reset, the state a rollout is stamped with
(`Trajectory.core_state`) is exactly the state its first step starts from, and the learner
unrolls from it with nothing else to know.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from podrace.algos.base import RecurrentApply
from podrace.algos.distributions import Categorical, Gaussian
from podrace.networks.actor_critic import POLICY_GAIN, VALUE_GAIN, _head
from podrace.types import PyTree

CORES = ("lstm", "gru")


def zero_state(core: str, size: int, batch: int) -> PyTree:
    """The core's initial state for `batch` envs, as host arrays: LSTM (c, h), GRU h; each
    float32 [batch, size]."""
    if core == "lstm":
        return (np.zeros((batch, size), np.float32), np.zeros((batch, size), np.float32))
    if core == "gru":
        return np.zeros((batch, size), np.float32)
    raise ValueError(f"unknown recurrent core {core!r}; cores: {', '.join(CORES)}")


def reset_after_invalid(state: PyTree, valid: jax.Array) -> PyTree:
    """The state the next step starts from: `state` where this step was valid, the initial
    (zero) state where it was an autoreset step (valid [B], each leaf of state [B, ...])."""

    def reset(leaf):
        keep = valid.reshape(valid.shape + (1,) * (leaf.ndim - valid.ndim))
        return jnp.where(keep, leaf, jnp.zeros_like(leaf))

    return jax.tree.map(reset, state)


class ResettingCore(nn.Module):
    """One step of the core, then the reset rule: (state, (features [B, F], valid [B])) ->
    (next state, (output [B, size], next state))."""

    core: str
    size: int

    @nn.compact
    def __call__(self, state: PyTree, inputs: tuple[jax.Array, jax.Array]):
        features, valid = inputs
        if self.core == "lstm":
            cell = nn.OptimizedLSTMCell(self.size, name="lstm")
        else:
            cell = nn.GRUCell(self.size, name="gru")
        state, out = cell(state, features)
        state = reset_after_invalid(state, valid)
        return state, (out, state)


class RecurrentActorCritic(nn.Module):
    """Torso, core and heads over time-major observations [T, B, *obs_shape]:
    `(obs, valid, state) -> (dist [T, B], value [T, B], states)` (see `RecurrentApply`).

    The torso runs on all T x B observations at once; only the core steps through time.
    Torso and core are shared by the policy and value heads; the heads are ActorCritic's.
    """

    torso: nn.Module
    obs_shape: Sequence[int]
    core: str
    core_size: int
    num_actions: int | None = None
    action_dim: int | None = None

    @nn.compact
    def __call__(self, obs: jax.Array, valid: jax.Array, state: PyTree):
        obs_shape = tuple(self.obs_shape)
        if obs.ndim != len(obs_shape) + 2 or tuple(obs.shape[2:]) != obs_shape:
            raise ValueError(
                f"a recurrent network takes observations [T, B, *{obs_shape}], got {obs.shape}"
            )
        steps, batch = obs.shape[:2]
        features = self.torso(obs.reshape((steps * batch,) + obs_shape))
        features = features.reshape((steps, batch, -1))
        scan = nn.scan(
            ResettingCore,
            variable_broadcast="params",
            split_rngs={"params": False},
            in_axes=0,
            out_axes=0,
        )
        _, (outputs, states) = scan(self.core, self.core_size, name="core")(
            state, (features, valid.astype(bool))
        )
        outputs = outputs.reshape((steps * batch, -1))
        value = _head(1, VALUE_GAIN, "value_head")(outputs)[:, 0].reshape((steps, batch))
        if self.num_actions is not None:
            logits = _head(self.num_actions, POLICY_GAIN, "policy_head")(outputs)
            return Categorical(logits.reshape((steps, batch, self.num_actions))), value, states
        if self.action_dim is None:
            raise ValueError("RecurrentActorCritic needs num_actions or action_dim")
        mean = _head(self.action_dim, POLICY_GAIN, "policy_head")(outputs)
        mean = mean.reshape((steps, batch, self.action_dim))
        log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,), jnp.float32)
        return Gaussian(mean, jnp.broadcast_to(log_std, mean.shape)), value, states


@dataclass(frozen=True)
class RecurrentNetwork:
    """A RecurrentActorCritic with what runtimes use of any network: `init(key, obs)` with
    observations [*batch, *obs_shape] (at most one batch dim, as they pass them to a
    feed-forward network's init) and `apply`, here a `RecurrentApply`."""

    module: RecurrentActorCritic

    def initial_state(self, batch: int) -> PyTree:
        return zero_state(self.module.core, self.module.core_size, batch)

    def init(self, key: jax.Array, obs: jax.Array) -> PyTree:
        obs_shape = tuple(self.module.obs_shape)
        batch = math.prod(obs.shape[: obs.ndim - len(obs_shape)])
        obs = jnp.reshape(obs, (1, batch) + obs_shape)
        return self.module.init(key, obs, jnp.ones((1, batch), bool), self.initial_state(batch))

    @property
    def apply(self) -> RecurrentApply:
        return RecurrentApply(self.module.apply, self.initial_state)
