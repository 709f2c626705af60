"""Hyperparameters as update inputs (`tunable`): the same update as the constants give, and
a change of value reaches the update without a new compile."""

import dataclasses

import jax
import numpy as np
import pytest

from podrace.algos.impala import make_impala
from podrace.algos.ppo import make_ppo
from podrace.algos.tunable import Tuned, replaced
from podrace.config import ImpalaConfig, PPOConfig
from podrace.pbt.config import MUTABLE
from tests.algos.helpers import random_trajectory, small_network

pytestmark = pytest.mark.timeout(180)


def _make(name, net, tunable=(), **overrides):
    if name == "ppo":
        cfg = dataclasses.replace(PPOConfig(num_epochs=1, num_minibatches=1), **overrides)
        return make_ppo(cfg, net.apply, 10, None, 1, tunable)
    cfg = dataclasses.replace(ImpalaConfig(num_minibatches=1), **overrides)
    return make_impala(cfg, net.apply, 10, None, 1, tunable)


def _keys(num_envs):
    return jax.random.split(jax.random.PRNGKey(3), num_envs)


@pytest.fixture(scope="module", params=["ppo", "impala"])
def tuned(request):
    """(name, network, params, trajectory, the algorithm taking every hyperparameter it
    allows as inputs, its jitted update, the list its every trace appends to): compiled
    once for both tests of an algorithm."""
    name = request.param
    net, params = small_network(True)
    traj = random_trajectory(net, params, True, T=4, B=4, seed=0)
    algo = _make(name, net, tuple(MUTABLE[name]))
    traces = []

    def traced(state, traj, keys):
        traces.append(1)  # runs only while tracing
        return algo.update(state, traj, keys)

    return name, net, params, traj, algo, jax.jit(traced), traces


def test_inputs_compute_what_constants_do(tuned):
    name, net, params, traj, algo, update, _ = tuned
    fixed = _make(name, net)
    state = algo.init(params)
    assert isinstance(state.opt_state, Tuned) and set(state.opt_state.hyperparameters) == set(
        MUTABLE[name]
    )
    a, metrics_a = jax.jit(fixed.update)(fixed.init(params), traj, _keys(4))
    b, metrics_b = update(state, traj, _keys(4))
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)
    assert float(metrics_b["learning_rate"]) == pytest.approx(float(metrics_a["learning_rate"]))
    carried = state.opt_state.hyperparameters["learning_rate"]
    assert float(metrics_b["hp/learning_rate"]) == pytest.approx(float(carried))


def test_a_new_value_reaches_the_update_without_a_compile(tuned):
    """Each changed hyperparameter changes the update (it is used, not ignored), and the
    jitted update compiles once for all of them."""
    name, _, params, traj, algo, update, traces = tuned
    state = algo.init(params)
    base, _ = update(state, traj, _keys(4))
    base_values = {n: float(v) for n, v in state.opt_state.hyperparameters.items()}
    for n in MUTABLE[name]:
        values = {**base_values, n: base_values[n] * 0.8}
        moved = state._replace(opt_state=replaced(state.opt_state, values))
        new, metrics = update(moved, traj, _keys(4))
        assert float(metrics[f"hp/{n}"]) == pytest.approx(values[n])
        changed = any(
            not np.array_equal(x, y)
            for x, y in zip(jax.tree.leaves(base.params), jax.tree.leaves(new.params), strict=True)
        )
        assert changed, f"{n} changed nothing in the update"
    assert len(traces) == 1
