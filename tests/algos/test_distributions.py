import math

import jax
import jax.numpy as jnp
import numpy as np

from podrace.algos.distributions import Categorical, Gaussian


def _np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_categorical_log_prob_entropy_mode():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 6)).astype(np.float32) * 2
    actions = rng.integers(0, 6, size=(3, 5))
    dist = Categorical(jnp.asarray(logits))
    logp = _np_log_softmax(logits.astype(np.float64))
    expected = np.take_along_axis(logp, actions[..., None], -1)[..., 0]
    np.testing.assert_allclose(dist.log_prob(jnp.asarray(actions)), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dist.entropy(), -(np.exp(logp) * logp).sum(-1), rtol=1e-5)
    np.testing.assert_array_equal(dist.mode(), logits.argmax(-1))


def test_categorical_masked_logits_have_finite_entropy():
    dist = Categorical(jnp.array([[0.0, -jnp.inf, 0.0]]))
    np.testing.assert_allclose(dist.entropy(), [math.log(2.0)], rtol=1e-6)


def test_categorical_sample_frequencies():
    probs = np.array([0.1, 0.6, 0.3])
    dist = Categorical(jnp.broadcast_to(jnp.log(jnp.asarray(probs, jnp.float32)), (50_000, 3)))
    samples = np.asarray(jax.jit(Categorical.sample)(dist, jax.random.PRNGKey(0)))
    assert samples.dtype == np.int32 and samples.shape == (50_000,)
    np.testing.assert_allclose(np.bincount(samples, minlength=3) / samples.size, probs, atol=0.01)


def test_gaussian_log_prob_entropy_mode():
    rng = np.random.default_rng(1)
    mean = rng.normal(size=(4, 7, 3)).astype(np.float32)
    log_std = rng.normal(scale=0.5, size=(3,)).astype(np.float32)  # state-independent
    action = rng.normal(size=(4, 7, 3)).astype(np.float32)
    dist = Gaussian(jnp.asarray(mean), jnp.asarray(log_std))
    std = np.exp(log_std.astype(np.float64))
    per_dim = -((action - mean) ** 2) / (2 * std**2) - np.log(std * np.sqrt(2 * np.pi))
    np.testing.assert_allclose(
        dist.log_prob(jnp.asarray(action)), per_dim.sum(-1), rtol=1e-5, atol=1e-5
    )
    entropy = dist.entropy()
    assert entropy.shape == (4, 7)
    np.testing.assert_allclose(
        entropy, np.full((4, 7), np.sum(0.5 * np.log(2 * np.pi * np.e * std**2))), rtol=1e-6
    )
    np.testing.assert_array_equal(dist.mode(), mean)


def test_gaussian_sample_statistics():
    mean = jnp.array([1.0, -2.0])
    log_std = jnp.log(jnp.array([0.5, 2.0]))
    dist = Gaussian(jnp.broadcast_to(mean, (100_000, 2)), log_std)
    samples = np.asarray(jax.jit(Gaussian.sample)(dist, jax.random.PRNGKey(0)))
    np.testing.assert_allclose(samples.mean(0), [1.0, -2.0], atol=0.03)
    np.testing.assert_allclose(samples.std(0), [0.5, 2.0], rtol=0.02)


def test_distributions_are_pytrees_returned_from_jit():
    @jax.jit
    def make(x):
        return Categorical(x), Gaussian(x, jnp.zeros_like(x))

    cat, gauss = make(jnp.zeros((2, 3)))
    assert isinstance(cat, Categorical) and isinstance(gauss, Gaussian)
    assert len(jax.tree.leaves((cat, gauss))) == 3
