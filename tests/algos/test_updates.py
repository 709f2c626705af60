"""update() on one device (axis_name=None): metrics, finiteness, schedules, and learning."""

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podrace.algos.base import TrainState
from podrace.algos.impala import make_impala
from podrace.algos.ppo import make_ppo
from podrace.config import ImpalaConfig, PPOConfig
from podrace.types import Trajectory
from tests.algos.helpers import NUM_ACTIONS, OBS_DIM, random_trajectory, small_network


def env_keys(seed: int, num_envs: int):
    """One raw key per env column, as the learner passes them."""
    return jax.random.split(jax.random.PRNGKey(seed), num_envs)


def _algo(name, net, num_updates=10, scan_unroll=1, **overrides):
    if name == "ppo":
        cfg = dataclasses.replace(PPOConfig(num_epochs=2, num_minibatches=2), **overrides)
        return make_ppo(cfg, net.apply, num_updates, None, scan_unroll)
    cfg = dataclasses.replace(ImpalaConfig(num_minibatches=2), **overrides)
    return make_impala(cfg, net.apply, num_updates, None, scan_unroll)


@pytest.mark.parametrize("name", ["ppo", "impala"])
def test_nonfinite_data_is_reported(name):
    net, params = small_network(True)
    traj = random_trajectory(net, params, True, T=4, B=4, seed=0)
    algo = _algo(name, net)
    update = jax.jit(algo.update)
    state = algo.init(params)
    _, metrics = update(state, traj, env_keys(0, 4))
    assert metrics["finite"].dtype == jnp.bool_ and bool(metrics["finite"])
    t, b = map(int, np.argwhere(np.asarray(traj.valid))[0])
    bad = traj._replace(rewards=traj.rewards.at[t, b].set(jnp.nan))
    new_state, metrics = update(state, bad, env_keys(0, 4))
    assert not bool(metrics["finite"])
    assert int(new_state.step) == 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["ppo", "impala"])
def test_nan_gradient_with_a_finite_loss_is_reported(name):
    """NaN observations on an invalid step are masked out of the loss (it stays finite) but
    0 * NaN still poisons the gradient: the update must count as non-finite."""
    net, params = small_network(True)
    traj = random_trajectory(net, params, True, T=4, B=4, seed=0)
    # One optimizer step: after a NaN step the params, and so every later loss, are NaN.
    one_step = {"num_epochs": 1, "num_minibatches": 1} if name == "ppo" else {"num_minibatches": 1}
    algo = _algo(name, net, **one_step)
    update = jax.jit(algo.update)
    # An invalid first step: its previous rollout ended, nothing in this one depends on it.
    b = int(np.flatnonzero(~np.asarray(traj.valid)[0])[0])
    bad = traj._replace(obs=traj.obs.at[0, b].set(jnp.nan))
    _, metrics = update(algo.init(params), bad, env_keys(0, 4))
    assert np.isfinite(float(metrics["loss"]))
    assert not bool(metrics["finite"])


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", ["ppo", "impala"])
def test_a_nonfinite_last_minibatch_step_is_reported(name):
    """A NaN observation on one valid step poisons only the minibatch that holds it (and
    the ones after it). Planting it in every env column (IMPALA) or time step (PPO, one
    epoch) in turn puts it in the LAST minibatch step at least once; each must count."""
    net, params = small_network(True)
    traj = random_trajectory(net, params, True, T=4, B=4, seed=0)
    algo = _algo(name, net, num_epochs=1) if name == "ppo" else _algo(name, net)
    update = jax.jit(algo.update)
    state = algo.init(params)
    valid = np.asarray(traj.valid)
    if name == "ppo":  # 2 of a column's 4 steps go to each minibatch: 3 valid ones hit both
        b = int(np.argmax(valid.sum(axis=0)))
        cells = [(t, b) for t in np.flatnonzero(valid[:, b])]
        assert len(cells) >= 3
    else:  # each block of 2 envs deals one env to each minibatch
        cells = [(int(np.flatnonzero(valid[:, b])[0]), b) for b in range(4)]
    for t, b in cells:
        _, metrics = update(
            state, traj._replace(obs=traj.obs.at[t, b].set(jnp.nan)), env_keys(0, 4)
        )
        assert not bool(metrics["finite"]), (t, b)


@pytest.mark.parametrize("name,steps_per_update", [("ppo", 4), ("impala", 2)])
def test_learning_rate_anneals_linearly_over_all_optimizer_steps(name, steps_per_update):
    """PPO decays every optimizer step; IMPALA holds one rate per update (Cleanba)."""
    net, params = small_network(True)
    traj = random_trajectory(net, params, True, T=4, B=4, seed=1)
    num_updates, lr = 10, 1e-3
    algo = _algo(name, net, num_updates=num_updates, learning_rate=lr)
    update = jax.jit(algo.update)
    state = algo.init(params)
    total = num_updates * steps_per_update
    for step in (0, 3):
        first = step * steps_per_update
        if name == "ppo":
            expected = np.mean([lr * (1 - (first + i) / total) for i in range(steps_per_update)])
        else:
            expected = lr * (1 - step / num_updates)
        _, metrics = update(state._replace(step=jnp.int32(step)), traj, env_keys(0, 4))
        np.testing.assert_allclose(metrics["learning_rate"], expected, rtol=1e-5)
    constant = _algo(name, net, learning_rate=lr, anneal_lr=False)
    _, metrics = jax.jit(constant.update)(
        constant.init(params)._replace(step=jnp.int32(5)), traj, env_keys(0, 4)
    )
    np.testing.assert_allclose(metrics["learning_rate"], lr, rtol=1e-6)


def test_scan_unroll_does_not_change_the_result():
    net, params = small_network(False)
    traj = random_trajectory(net, params, False, T=4, B=4, seed=2)
    results = []
    for unroll in (1, 4):
        algo = _algo("ppo", net, scan_unroll=unroll)
        results.append(jax.jit(algo.update)(algo.init(params), traj, env_keys(3, 4))[0].params)
    for a, b in zip(jax.tree.leaves(results[0]), jax.tree.leaves(results[1])):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_indivisible_minibatches_are_rejected():
    net, params = small_network(True)
    traj = random_trajectory(net, params, True, T=3, B=3, seed=0)
    for name in ("ppo", "impala"):
        algo = _algo(name, net)
        with pytest.raises(ValueError, match="num_minibatches"):
            jax.jit(algo.update)(algo.init(params), traj, env_keys(0, 3))


@partial(jax.jit, static_argnums=(0,))
def _bandit_rollout(net, params, key):
    """T=8, B=16 one-step bandit: action NUM_ACTIONS-1 pays 1, others 0; no episode ends."""
    T, B = 8, 16
    obs_key, act_key = jax.random.split(key)
    obs = jax.random.normal(obs_key, (T, B, OBS_DIM))
    dist, values = net.apply(params, obs)
    actions = dist.sample(act_key)
    last_obs = jax.random.normal(obs_key, (B, OBS_DIM))
    false = jnp.zeros((T, B), bool)
    traj = Trajectory(
        obs=obs,
        actions=actions,
        logprobs=dist.log_prob(actions),
        values=values,
        rewards=(actions == NUM_ACTIONS - 1).astype(jnp.float32),
        terminated=false,
        truncated=false,
        valid=~false,
        last_obs=last_obs,
        last_value=net.apply(params, last_obs)[1],
    )
    probs = jnp.mean(jax.nn.softmax(dist.logits, -1)[..., NUM_ACTIONS - 1])
    return traj, probs


@pytest.mark.parametrize("name", ["ppo", "impala"])
def test_learns_a_bandit(name):
    net, _ = small_network(True)
    params = net.init(jax.random.PRNGKey(0), jnp.zeros((OBS_DIM,)))
    # One rate per algorithm, each learning this bandit within 30 updates.
    lr = 3e-3 if name == "ppo" else 3e-2
    algo = _algo(name, net, num_updates=30, gamma=0.0, learning_rate=lr, anneal_lr=False)
    update = jax.jit(algo.update)
    state: TrainState = algo.init(params)
    key = jax.random.PRNGKey(0)
    first = None
    for _ in range(30):
        key, rollout_key, update_key = jax.random.split(key, 3)
        traj, prob = _bandit_rollout(net, state.params, rollout_key)
        first = float(prob) if first is None else first
        state, metrics = update(state, traj, jax.random.split(update_key, 16))
        assert bool(metrics["finite"])
    _, prob = _bandit_rollout(net, state.params, key)
    assert int(state.step) == 30
    assert first < 0.4 and float(prob) > 0.8, (first, float(prob))


@pytest.mark.timeout(60)
def test_a_nonfinite_gradient_with_a_finite_loss_is_reported():
    """A NaN input on an invalid step is masked out of the loss by jnp.where but not out of
    the gradient (the where-gradient trap): the step must still be reported non-finite."""
    import optax

    from podrace.algos.common import sgd_step

    def loss_fn(params, batch):
        x, valid = batch
        loss = jnp.sum(jnp.where(valid, params["w"] * x, 0.0))
        return loss, {"loss": loss}

    params = {"w": jnp.ones(3)}
    optimizer = optax.sgd(0.1)
    batch = (jnp.array([1.0, jnp.nan, 2.0]), jnp.array([True, False, True]))
    _, _, metrics = jax.jit(partial(sgd_step, optimizer, loss_fn, axis_name=None))(
        params=params, opt_state=optimizer.init(params), batch=batch
    )
    assert np.isfinite(float(metrics["loss"])), (
        "the loss saw the masked step: the test proves nothing"
    )
    assert not np.isfinite(float(metrics["grad_norm"]))
    assert not bool(metrics["finite"])


@pytest.mark.timeout(30)
def test_an_update_is_finite_only_if_every_minibatch_step_was():
    from podrace.algos.common import reduce_metrics

    for steps in ([True, True, False], [False, True, True], [True, False, True]):
        out = reduce_metrics({"finite": jnp.asarray(steps), "loss": jnp.zeros(3)})
        assert not bool(out["finite"]), steps
    assert bool(reduce_metrics({"finite": jnp.ones(3, bool), "loss": jnp.zeros(3)})["finite"])
