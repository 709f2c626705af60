"""Actor-critic heads on top of a torso: `(dist, value) = ActorCritic(...)(obs)`."""

from __future__ import annotations

import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from podrace.algos.distributions import Categorical, Gaussian

POLICY_GAIN = 0.01
VALUE_GAIN = 1.0


def _head(features: int, gain: float, name: str) -> nn.Dense:
    return nn.Dense(
        features,
        kernel_init=nn.initializers.orthogonal(gain),
        bias_init=nn.initializers.zeros,
        name=name,
    )


class ActorCritic(nn.Module):
    """Policy and value heads over a torso, for any number of leading batch dims.

    Observations [*batch, *obs_shape] are flattened to [N, *obs_shape] for the torso and
    the outputs reshaped back, so [B, ...] (acting) and [T, B, ...] (learning) both work.
    `value_torso=None` shares `torso` between both heads. Continuous policies are a
    diagonal Gaussian with a state-independent log_std parameter (init 0); its
    `log_std` is broadcast to the mean's shape so the dist pytree has uniform leaves.
    """

    torso: nn.Module
    value_torso: nn.Module | None
    obs_shape: Sequence[int]
    num_actions: int | None = None
    """Discrete action count; None for a continuous action vector of `action_dim`."""
    action_dim: int | None = None

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[Categorical | Gaussian, jax.Array]:
        obs_ndim = len(self.obs_shape)
        if tuple(obs.shape[obs.ndim - obs_ndim :]) != tuple(self.obs_shape):
            raise ValueError(
                f"observation shape {obs.shape} does not end with {tuple(self.obs_shape)}"
            )
        batch_shape = obs.shape[: obs.ndim - obs_ndim]
        flat = obs.reshape((math.prod(batch_shape),) + tuple(self.obs_shape))

        features = self.torso(flat)
        value_features = features if self.value_torso is None else self.value_torso(flat)
        value = _head(1, VALUE_GAIN, "value_head")(value_features)[:, 0].reshape(batch_shape)

        if self.num_actions is not None:
            logits = _head(self.num_actions, POLICY_GAIN, "policy_head")(features)
            return Categorical(logits.reshape(batch_shape + (self.num_actions,))), value
        if self.action_dim is None:
            raise ValueError("ActorCritic needs num_actions (discrete) or action_dim (continuous)")
        mean = _head(self.action_dim, POLICY_GAIN, "policy_head")(features)
        mean = mean.reshape(batch_shape + (self.action_dim,))
        log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,), jnp.float32)
        return Gaussian(mean, jnp.broadcast_to(log_std, mean.shape)), value
