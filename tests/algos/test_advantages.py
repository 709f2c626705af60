import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podrace.algos.advantages import gae, vtrace
from tests.algos import numpy_reference as ref

T, B = 12, 9


def _data(seed):
    rng = np.random.default_rng(seed)
    terminated, truncated, valid = ref.episode_patterns(rng, T, B)
    return dict(
        rewards=rng.normal(size=(T, B)).astype(np.float32),
        values=rng.normal(size=(T, B)).astype(np.float32),
        last_value=rng.normal(size=(B,)).astype(np.float32),
        terminated=terminated,
        truncated=truncated,
        valid=valid,
    ), rng


def _jnp(d):
    return {k: jnp.asarray(v) for k, v in d.items()}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 1.0), (0.5, 0.0)])
def test_gae_matches_numpy(seed, gamma, lam):
    data, _ = _data(seed)
    assert data["terminated"][-1, 0] and data["truncated"][-1, 1]
    assert not data["valid"].all() and (
        data["terminated"][:-1].any() or data["truncated"][:-1].any()
    )
    adv, ret = jax.jit(gae, static_argnums=(6, 7))(*_jnp(data).values(), gamma, lam)
    adv_ref, ret_ref = ref.gae(**data, gamma=gamma, lam=lam)
    np.testing.assert_allclose(adv, adv_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, ret_ref, rtol=1e-5, atol=1e-5)


def test_gae_truncation_bootstraps_from_next_value_and_termination_does_not():
    # One env, T=4: step 0 truncated (bootstrap V(final obs) = values[1] = 10), step 1 is the
    # autoreset step, step 2 terminated (no bootstrap), step 3 autoreset.
    rewards = jnp.array([[1.0], [0.0], [2.0], [0.0]])
    values = jnp.array([[0.5], [10.0], [3.0], [7.0]])
    truncated = jnp.array([[True], [False], [False], [False]])
    terminated = jnp.array([[False], [False], [True], [False]])
    valid = jnp.array([[True], [False], [True], [False]])
    adv, ret = gae(rewards, values, jnp.array([100.0]), terminated, truncated, valid, 0.9, 0.95)
    np.testing.assert_allclose(adv[:, 0], [1.0 + 0.9 * 10.0 - 0.5, 0.0, 2.0 - 3.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(ret[:, 0], [1.0 + 0.9 * 10.0, 10.0, 2.0, 7.0], rtol=1e-6)


def test_invalid_steps_do_not_leak():
    data, rng = _data(3)
    invalid = ~data["valid"]
    noisy = dict(
        data,
        rewards=np.where(invalid, 1e6 * rng.normal(size=(T, B)), data["rewards"]).astype(
            np.float32
        ),
    )
    for fn in (gae,):
        a = fn(*_jnp(data).values(), 0.99, 0.95)
        b = fn(*_jnp(noisy).values(), 0.99, 0.95)
        for x, y in zip(a, b):
            np.testing.assert_allclose(
                np.where(data["valid"], x, 0), np.where(data["valid"], y, 0), rtol=1e-6
            )
    # V-trace: garbage log-probs (and rewards) on autoreset steps must not change valid outputs.
    lp = rng.normal(size=(2, T, B)).astype(np.float32)
    lp_noisy = np.where(invalid, 50.0 * rng.normal(size=(2, T, B)), lp).astype(np.float32)
    a = vtrace(*lp, *_jnp(data).values(), 0.99, 1.0, 1.0, 1.0)
    b = vtrace(*lp_noisy, *_jnp(noisy).values(), 0.99, 1.0, 1.0, 1.0)
    for x, y in zip(a, b):
        np.testing.assert_allclose(
            np.where(data["valid"], x, 0), np.where(data["valid"], y, 0), rtol=1e-5
        )


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("gamma,lam,rho_bar,c_bar", [(0.99, 1.0, 1.0, 1.0), (0.9, 0.9, 1.5, 0.8)])
def test_vtrace_matches_numpy(seed, gamma, lam, rho_bar, c_bar):
    data, rng = _data(seed)
    behaviour = rng.normal(size=(T, B)).astype(np.float32)
    target = (behaviour + rng.normal(scale=0.7, size=(T, B))).astype(np.float32)
    ratio = np.exp(target - behaviour)
    assert (ratio > max(rho_bar, c_bar)).mean() > 0.1 and (ratio < min(rho_bar, c_bar)).mean() > 0.1
    fn = jax.jit(vtrace, static_argnums=(8, 9, 10, 11))
    vs, pg = fn(
        jnp.asarray(behaviour),
        jnp.asarray(target),
        *_jnp(data).values(),
        gamma,
        lam,
        rho_bar,
        c_bar,
    )
    vs_ref, pg_ref = ref.vtrace(
        behaviour, target, **data, gamma=gamma, lam=lam, rho_bar=rho_bar, c_bar=c_bar
    )
    np.testing.assert_allclose(vs, vs_ref, rtol=1e-5, atol=1e-5)
    valid = data["valid"]
    np.testing.assert_allclose(np.where(valid, pg, 0), pg_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lam", [1.0, 0.95])
def test_vtrace_on_policy_equals_gae_lambda_returns(lam):
    data, rng = _data(4)
    logp = jnp.asarray(rng.normal(size=(T, B)).astype(np.float32))
    vs, _ = vtrace(logp, logp, *_jnp(data).values(), 0.97, lam, 1.0, 1.0)
    _, returns = gae(*_jnp(data).values(), 0.97, lam)
    np.testing.assert_allclose(vs, returns, rtol=1e-5, atol=1e-5)


def test_vtrace_outputs_carry_no_gradient():
    data, rng = _data(5)
    logp = jnp.asarray(rng.normal(size=(T, B)).astype(np.float32))

    def f(values):
        vs, pg = vtrace(
            logp,
            logp,
            data["rewards"],
            values,
            data["last_value"],
            data["terminated"],
            data["truncated"],
            data["valid"],
            0.99,
            1.0,
            1.0,
            1.0,
        )
        return jnp.sum(vs) + jnp.sum(pg)

    assert not np.any(jax.grad(f)(jnp.asarray(data["values"])))
