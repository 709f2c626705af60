"""Running observation statistics and reward scaling: pure functions checked against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from podrace.algos.normalization import (
    ReturnTracker,
    discounted_returns,
    init_stats,
    normalize,
    scale_rewards,
    update_stats,
)

AXIS = "learner"


def _batches(seed=0, n=3, T=6, B=8, D=3):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        x = rng.normal(5.0, 3.0, (T, B, D)).astype(np.float32) * np.array(
            [1.0, 10.0, 0.1], np.float32
        )
        valid = rng.random((T, B)) > 0.3
        x[~valid] = 1e6  # autoreset steps: must not count
        yield x, valid


@pytest.mark.timeout(60)
def test_update_stats_equals_numpy_over_all_valid_samples():
    stats = init_stats((3,))
    seen = []
    for x, valid in _batches():
        stats = jax.jit(update_stats)(stats, x, valid)
        seen.append(x[valid])
    seen = np.concatenate(seen)
    assert float(stats.count) == pytest.approx(len(seen), abs=1e-3)
    np.testing.assert_allclose(stats.mean, seen.mean(0), rtol=1e-4)
    np.testing.assert_allclose(stats.var, seen.var(0), rtol=1e-3)


@pytest.mark.timeout(60)
def test_sharded_update_equals_unsharded():
    mesh = Mesh(np.array(jax.devices()[:4]), (AXIS,))
    sharded = jax.jit(
        jax.shard_map(
            lambda s, x, v: update_stats(s, x, v, axis_name=AXIS),
            mesh=mesh,
            in_specs=(P(), P(None, AXIS), P(None, AXIS)),
            out_specs=P(),
        )
    )
    whole, parts = init_stats((3,)), init_stats((3,))
    for x, valid in _batches(seed=1):
        whole = update_stats(whole, x, valid)
        parts = sharded(parts, x, valid)
    for a, b in zip(whole, parts):
        np.testing.assert_allclose(a, b, rtol=1e-5)


@pytest.mark.timeout(60)
def test_normalize_standardizes_and_clips():
    x, valid = next(_batches(seed=2))
    stats = update_stats(init_stats((3,)), x, valid)
    z = np.asarray(normalize(stats, x[valid], clip=10.0))
    np.testing.assert_allclose(z.mean(0), 0.0, atol=1e-4)
    np.testing.assert_allclose(z.std(0), 1.0, rtol=1e-3)
    assert np.abs(np.asarray(normalize(stats, x, clip=5.0))).max() == 5.0  # the 1e6 entries


def _numpy_returns(g, rewards, done, valid, gamma):
    out = np.zeros_like(rewards)
    for t in range(len(rewards)):
        g = np.where(valid[t], g * gamma + rewards[t], 0.0)
        out[t] = g
        g = np.where(done[t], 0.0, g)
    return g, out


@pytest.mark.timeout(60)
def test_discounted_returns_reset_at_episode_ends_and_carry_across_rollouts():
    rng = np.random.default_rng(3)
    T, B, gamma = 10, 4, 0.9
    rewards = rng.normal(size=(T, B)).astype(np.float32)
    done = rng.random((T, B)) < 0.2
    valid = np.ones((T, B), bool)
    valid[1:] = ~done[:-1]  # next-step autoreset: the step after a done one is invalid
    g0 = rng.normal(size=B).astype(np.float32)
    want_last, want = _numpy_returns(g0, rewards, done, valid, gamma)
    tracker, got = discounted_returns(ReturnTracker(jnp.asarray(g0)), rewards, done, valid, gamma)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(tracker.returns, want_last, rtol=1e-5)
    # Two rollouts of 5 steps give the same returns as one of 10.
    mid, first = discounted_returns(
        ReturnTracker(jnp.asarray(g0)), rewards[:5], done[:5], valid[:5], gamma
    )
    _, second = discounted_returns(mid, rewards[5:], done[5:], valid[5:], gamma)
    np.testing.assert_allclose(np.concatenate([first, second]), want, rtol=1e-5)


@pytest.mark.timeout(60)
def test_scale_rewards_divides_by_the_return_std_without_centering():
    returns = np.random.default_rng(4).normal(3.0, 4.0, (50, 8)).astype(np.float32)
    stats = update_stats(init_stats(()), returns, np.ones((50, 8), bool))
    rewards = np.array([1.0, -2.0, 400.0], np.float32)
    np.testing.assert_allclose(
        scale_rewards(stats, rewards, clip=10.0)[:2], rewards[:2] / returns.std(), rtol=1e-3
    )
    assert float(scale_rewards(stats, rewards, clip=10.0)[2]) == 10.0
