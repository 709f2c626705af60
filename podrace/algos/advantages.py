"""GAE and V-trace on time-major [T, B] rollouts with next-step autoreset.

Conventions (see podrace/types.py): step t with `terminated | truncated` ends an
episode; step t+1 is an autoreset step (`valid = False`) whose behaviour value is
V(final obs). So the value after step t is always `values[t + 1]` (or `last_value` for
t = T-1): a truncated step bootstraps from it, a terminated step does not, and a done
step cuts the backward recursion, so the garbage of the following invalid step never
reaches a valid one. Outputs on invalid steps are set to neutral values (advantage 0,
target = value) so they are harmless even if a loss forgets the mask.

The recursion cut uses `jnp.where`, not a multiply, so an overflow on an invalid step
cannot turn into 0 * inf = nan on the step before it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _next_values(values: jax.Array, last_value: jax.Array) -> jax.Array:
    """values[t + 1] for every t, with last_value after the last step."""
    return jnp.concatenate([values[1:], last_value[None]], axis=0)


def _discounted_backward(deltas: jax.Array, coefs: jax.Array, cut: jax.Array) -> jax.Array:
    """acc_t = deltas_t + (0 if cut_t else coefs_t * acc_{t+1}), acc_T = 0."""

    def step(acc, inputs):
        delta, coef, stop = inputs
        acc = delta + jnp.where(stop, 0.0, coef * acc)
        return acc, acc

    _, out = jax.lax.scan(step, jnp.zeros_like(deltas[0]), (deltas, coefs, cut), reverse=True)
    return out


def gae(
    rewards: jax.Array,
    values: jax.Array,
    last_value: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    valid: jax.Array,
    gamma: float,
    lam: float,
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation. Returns (advantages, returns), both [T, B].

    delta_t = r_t + gamma * values[t+1] * (1 - terminated_t) - values[t]
    A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1};  returns = A + values.
    """
    dtype = values.dtype
    terminated = terminated.astype(bool)
    done = terminated | truncated.astype(bool)
    bootstrap = jnp.where(terminated, 0.0, _next_values(values, last_value))
    deltas = rewards.astype(dtype) + gamma * bootstrap - values
    coefs = jnp.full_like(deltas, gamma * lam)
    advantages = _discounted_backward(deltas, coefs, done)
    valid = valid.astype(bool)
    advantages = jnp.where(valid, advantages, 0.0)
    returns = advantages + values
    return jax.lax.stop_gradient(advantages), jax.lax.stop_gradient(returns)


def vtrace(
    behaviour_logprobs: jax.Array,
    target_logprobs: jax.Array,
    rewards: jax.Array,
    values: jax.Array,
    last_value: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    valid: jax.Array,
    gamma: float,
    lam: float,
    rho_bar: float,
    c_bar: float,
) -> tuple[jax.Array, jax.Array]:
    """V-trace targets (Espeholt et al. 2018). Returns (vs, pg_advantages), both [T, B].

    rho_t = min(rho_bar, pi/mu), c_t = lam * min(c_bar, pi/mu)
    vs_t - V_t = rho_t * (r_t + gamma (1 - term_t) V_{t+1} - V_t)
                 + gamma (1 - done_t) c_t (vs_{t+1} - V_{t+1})
    pg_adv_t = rho_t * (r_t + gamma (1 - term_t) vs'_{t+1} - V_t), where vs'_{t+1} is
    vs_{t+1} inside an episode and V(final obs) = values[t+1] after a truncated step.
    Both outputs are wrapped in stop_gradient.
    """
    dtype = values.dtype
    terminated = terminated.astype(bool)
    done = terminated | truncated.astype(bool)
    ratios = jnp.exp(target_logprobs - behaviour_logprobs).astype(dtype)
    rhos = jnp.minimum(rho_bar, ratios)
    cs = lam * jnp.minimum(c_bar, ratios)
    next_values = _next_values(values, last_value)
    rewards = rewards.astype(dtype)
    deltas = rhos * (rewards + gamma * jnp.where(terminated, 0.0, next_values) - values)
    vs = _discounted_backward(deltas, gamma * cs, done) + values
    next_vs = jnp.where(done, next_values, _next_values(vs, last_value))
    pg_advantages = rhos * (rewards + gamma * jnp.where(terminated, 0.0, next_vs) - values)
    valid = valid.astype(bool)
    vs = jnp.where(valid, vs, values)
    pg_advantages = jnp.where(valid, pg_advantages, 0.0)
    return jax.lax.stop_gradient(vs), jax.lax.stop_gradient(pg_advantages)
