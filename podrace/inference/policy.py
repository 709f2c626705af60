"""The inference server's jitted functions: one policy call for a batch of requests, each
request sampled with its own actor's key, and the chain of sampling keys of a rollout.

A request is one env worker's part of one actor's envs (`part_envs` rows of the actor's
`actor_envs`) at one step. The actor loop (`podrace.actor`) samples an actor's `actor_envs`
actions with one key per step; the server samples each request's rows with that same key,
as those rows of the same draw (the draw for all `actor_envs` rows, of which the request's
are kept), so a rollout collected through the server is the one the actor loop collects
with the same params, keys and env seeds, whatever else shares the batch.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from podrace.actor import SAMPLING_PRNG


def make_serve_fn(apply_fn: Callable, actor_envs: int, part_envs: int) -> Callable:
    """jit((params, obs [R * part_envs, ...], requests uint32[R, 5]) -> (actions, log-probs,
    values), each [R * part_envs, ...]).

    Request r's row is its sampling key's data (4 words) and its first env among its
    actor's (one array: one transfer). It holds rows `first .. first + part_envs` of its
    actor's envs; its actions are those rows of `dist.sample(key)` drawn for all
    `actor_envs` rows.
    """

    def serve(params, obs, requests_info):
        keys, offsets = requests_info[:, :4], requests_info[:, 4].astype(jnp.int32)
        dist, value = apply_fn(params, obs)
        requests = keys.shape[0]
        parts = jax.tree.map(lambda x: x.reshape((requests, part_envs) + x.shape[1:]), dist)

        def sample(part, key_data, offset):
            # The request's rows placed where they are among its actor's envs: each row's
            # draw depends only on the key and the row, so the other rows' values (zeros)
            # change nothing; only the request's rows are kept.
            full = jax.tree.map(
                lambda x: jax.lax.dynamic_update_slice_in_dim(
                    jnp.zeros((actor_envs,) + x.shape[1:], x.dtype), x, offset, 0
                ),
                part,
            )
            action = full.sample(jax.random.wrap_key_data(key_data, impl=SAMPLING_PRNG))
            return jax.lax.dynamic_slice_in_dim(action, offset, part_envs, 0)

        # One draw per request, unrolled (not vmap: a batched unsafe_rbg key draws other
        # bits than the same key alone, and the draw must be the actor loop's; lax.map
        # would run them one after another, 4x slower for two requests on XLA:CPU).
        actions = jnp.concatenate(
            [
                sample(jax.tree.map(lambda x, r=r: x[r], parts), keys[r], offsets[r])
                for r in range(requests)
            ]
        )
        return actions, dist.log_prob(actions), value

    return jax.jit(serve)


def make_key_chain(length: int) -> Callable:
    """jit(key data uint32[4] -> (key data after `length` steps, sample keys uint32[length,
    4])): the keys the actor loop splits off step by step (`podrace.actor.make_policy_fns`)."""

    def chain(key_data):
        def step(key, _):
            key, sample_key = jax.random.split(jax.random.wrap_key_data(key, impl=SAMPLING_PRNG))
            return jax.random.key_data(key), jax.random.key_data(sample_key)

        return jax.lax.scan(step, key_data, None, length)

    return jax.jit(chain)


__all__ = ["make_key_chain", "make_serve_fn"]
