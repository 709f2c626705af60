import dataclasses
from functools import partial

import jax
import numpy as np
import pytest

from podrace.algos.advantages import vtrace
from podrace.algos.impala import impala_loss
from podrace.algos.ppo import ppo_loss
from podrace.config import ImpalaConfig, PPOConfig
from tests.algos import numpy_reference as ref
from tests.algos.helpers import (
    ppo_minibatch,
    random_trajectory,
    small_network,
    summed_impala_loss,
)


def _np(x):
    return np.asarray(x, np.float64)


def _ppo_reference(logp, value, entropy, mb, cfg):
    valid = np.asarray(mb.valid)
    mean = lambda x: ref.masked_mean(x, valid)  # noqa: E731
    log_ratio = logp - _np(mb.logprobs)
    ratio = np.exp(log_ratio)
    adv = _np(mb.advantages)
    if cfg.norm_adv:
        mu = mean(adv)
        adv = (adv - mu) / (np.sqrt(mean((adv - mu) ** 2)) + 1e-8)
    policy = -np.minimum(adv * ratio, adv * np.clip(ratio, 1 - cfg.clip_coef, 1 + cfg.clip_coef))
    returns, old_values = _np(mb.returns), _np(mb.values)
    if cfg.clip_value_loss:
        clipped = old_values + np.clip(value - old_values, -cfg.clip_coef, cfg.clip_coef)
        value_loss = 0.5 * np.maximum((value - returns) ** 2, (clipped - returns) ** 2)
    else:
        value_loss = 0.5 * (value - returns) ** 2
    out = {
        "policy_loss": mean(policy),
        "value_loss": mean(value_loss),
        "entropy": mean(entropy),
        "approx_kl": mean(ratio - 1 - log_ratio),
        "clip_frac": mean(np.abs(ratio - 1) > cfg.clip_coef),
    }
    out["loss"] = (
        out["policy_loss"] - cfg.ent_coef * out["entropy"] + cfg.vf_coef * out["value_loss"]
    )
    return out


@partial(jax.jit, static_argnums=0)
def _outputs(net, params, obs, actions):
    """(log_prob(actions), value, entropy) straight from the network."""
    dist, value = net.apply(params, obs)
    logp = None if actions is None else dist.log_prob(actions)
    return logp, value, dist.entropy()


@pytest.mark.parametrize("discrete", [True, False])
@pytest.mark.parametrize("norm_adv,clip_value_loss", [(True, True), (False, False)])
def test_ppo_loss_matches_numpy(discrete, norm_adv, clip_value_loss):
    net, params = small_network(discrete)
    traj = random_trajectory(net, params, discrete, T=6, B=8, seed=0)
    mb = ppo_minibatch(traj, np.random.default_rng(0))
    cfg = dataclasses.replace(
        PPOConfig(), norm_adv=norm_adv, clip_value_loss=clip_value_loss, ent_coef=0.05
    )

    loss, metrics = jax.jit(lambda p, m: ppo_loss(p, net.apply, m, cfg, None))(params, mb)

    logp, value, entropy = _outputs(net, params, mb.obs, mb.actions)
    expected = _ppo_reference(_np(logp), _np(value), _np(entropy), mb, cfg)
    assert 0.1 < expected["clip_frac"] < 0.9  # clipping is exercised
    np.testing.assert_allclose(loss, expected["loss"], rtol=1e-4, atol=1e-5)
    for name, want in expected.items():
        np.testing.assert_allclose(metrics[name], want, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("discrete", [True, False])
def test_impala_loss_matches_numpy(discrete):
    net, params = small_network(discrete)
    traj = random_trajectory(net, params, discrete, T=7, B=6, seed=1)
    cfg = dataclasses.replace(ImpalaConfig(), gamma=0.95, vtrace_lambda=0.9, rho_bar=1.2, c_bar=0.9)

    loss, metrics = jax.jit(lambda p, t: impala_loss(p, net.apply, t, cfg, None))(params, traj)

    logp, values, entropy = _outputs(net, params, traj.obs, traj.actions)
    last_value = _outputs(net, params, traj.last_obs, None)[1]
    logp = _np(logp)
    valid, terminated, truncated = (
        np.asarray(x) for x in (traj.valid, traj.terminated, traj.truncated)
    )
    vs, pg = ref.vtrace(
        _np(traj.logprobs),
        logp,
        _np(traj.rewards),
        _np(values),
        _np(last_value),
        terminated,
        truncated,
        valid,
        cfg.gamma,
        cfg.vtrace_lambda,
        cfg.rho_bar,
        cfg.c_bar,
    )
    mean = lambda x: ref.masked_mean(x, valid)  # noqa: E731
    ratio = np.exp(logp - _np(traj.logprobs))
    expected = {
        "policy_loss": mean(-logp * pg),
        "value_loss": mean(0.5 * (vs - _np(values)) ** 2),
        "entropy": mean(_np(entropy)),
        "approx_kl": mean(ratio - 1 - np.log(ratio)),
        # a weight counts as truncated when the bar cuts at least 1% off it
        "rho_truncated": mean(ratio > 1.01 * cfg.rho_bar),
        "c_truncated": mean(ratio > 1.01 * cfg.c_bar),
    }
    expected["loss"] = (
        expected["policy_loss"]
        + cfg.vf_coef * expected["value_loss"]
        - cfg.ent_coef * expected["entropy"]
    )
    assert 0.1 < expected["rho_truncated"] < expected["c_truncated"] < 0.9
    # The optimizer's objective is the sum over valid steps; the metrics are means.
    np.testing.assert_allclose(loss, expected["loss"] * valid.sum(), rtol=1e-4, atol=1e-4)
    for name, want in expected.items():
        np.testing.assert_allclose(metrics[name], want, rtol=1e-4, atol=1e-5, err_msg=name)


def test_impala_policy_gradient_treats_vtrace_targets_as_constants():
    """d loss / d params must equal the gradient with vs and pg_adv precomputed as data."""
    net, params = small_network(True)
    traj = random_trajectory(net, params, True, T=5, B=4, seed=2)
    cfg = ImpalaConfig()
    grads = jax.jit(jax.grad(lambda p: impala_loss(p, net.apply, traj, cfg, None)[0]))(params)

    logp, values, _ = _outputs(net, params, traj.obs, traj.actions)
    last_value = _outputs(net, params, traj.last_obs, None)[1]
    vs, pg = jax.jit(vtrace, static_argnums=range(8, 12))(
        traj.logprobs,
        logp,
        traj.rewards,
        values,
        last_value,
        traj.terminated,
        traj.truncated,
        traj.valid,
        cfg.gamma,
        cfg.vtrace_lambda,
        cfg.rho_bar,
        cfg.c_bar,
    )
    vs, pg = np.asarray(vs), np.asarray(pg)
    expected = jax.jit(jax.grad(summed_impala_loss(net, traj, vs, pg, cfg)))(params)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
