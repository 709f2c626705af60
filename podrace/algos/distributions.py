"""Action distributions as NamedTuple pytrees, so a jitted policy can return them.

Only what PPO and IMPALA need: sample, log_prob, entropy and mode. Kept free of
distrax/tfp so the dependency set stays small and the maths is visible.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class Categorical(NamedTuple):
    """Categorical over the last axis of `logits` (unnormalised log-probabilities)."""

    logits: jax.Array  # [..., num_actions]

    def sample(self, key: jax.Array) -> jax.Array:
        return jax.random.categorical(key, self.logits, axis=-1).astype(jnp.int32)

    def log_prob(self, action: jax.Array) -> jax.Array:
        logp = jax.nn.log_softmax(self.logits, axis=-1)
        action = jnp.asarray(action, jnp.int32)[..., None]
        return jnp.take_along_axis(logp, action, axis=-1)[..., 0]

    def entropy(self) -> jax.Array:
        logp = jax.nn.log_softmax(self.logits, axis=-1)
        p = jnp.exp(logp)
        # p * logp is 0 * -inf = nan for masked (-inf) logits; their contribution is 0.
        return -jnp.sum(jnp.where(p > 0, p * logp, 0.0), axis=-1)

    def mode(self) -> jax.Array:
        return jnp.argmax(self.logits, axis=-1).astype(jnp.int32)


class Gaussian(NamedTuple):
    """Diagonal Gaussian over the last axis; log_prob and entropy sum over that axis.

    `log_std` may be the state-independent parameter of shape [A]; it is broadcast
    against `mean` wherever a shape matters.
    """

    mean: jax.Array  # [..., A]
    log_std: jax.Array  # broadcastable to mean

    def _log_std(self) -> jax.Array:
        return jnp.broadcast_to(self.log_std, jnp.shape(self.mean))

    def sample(self, key: jax.Array) -> jax.Array:
        noise = jax.random.normal(key, jnp.shape(self.mean), jnp.result_type(self.mean))
        return self.mean + jnp.exp(self._log_std()) * noise

    def log_prob(self, action: jax.Array) -> jax.Array:
        log_std = self._log_std()
        z = (action - self.mean) * jnp.exp(-log_std)
        return jnp.sum(-0.5 * jnp.square(z) - log_std - _HALF_LOG_2PI, axis=-1)

    def entropy(self) -> jax.Array:
        return jnp.sum(self._log_std() + 0.5 + _HALF_LOG_2PI, axis=-1)

    def mode(self) -> jax.Array:
        return self.mean
