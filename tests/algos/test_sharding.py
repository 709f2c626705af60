"""update() under jax.shard_map: 4 shards must equal 1 device on the whole batch.

Keys are raw uint32 PRNG keys, one per env column: a [B, 2] array sharded with
P('learner') like the data, so each shard receives the keys of its own envs.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from podrace.algos.impala import make_impala
from podrace.algos.ppo import make_ppo, ppo_loss
from podrace.config import ImpalaConfig, PPOConfig
from podrace.types import Trajectory
from tests.algos.helpers import ppo_minibatch, random_trajectory, small_network

AXIS = "learner"
TRAJ_SPEC = Trajectory(
    *(P(None, AXIS),) * 8, last_obs=P(AXIS), last_value=P(AXIS), core_state=P(AXIS)
)


def _mesh(n):
    assert len(jax.devices()) >= 4, "tests/conftest.py should force 4 CPU devices"
    return Mesh(np.array(jax.devices()[:n]), (AXIS,))


def _sharded_update(algo, num_shards, check_vma=True):
    fn = jax.shard_map(
        algo.update,
        mesh=_mesh(num_shards),
        in_specs=(P(), TRAJ_SPEC, P(AXIS)),
        out_specs=(P(), P()),
        check_vma=check_vma,
    )
    return jax.jit(fn)


def _make(algo_name, net, **overrides):
    if algo_name == "ppo":
        cfg = dataclasses.replace(
            PPOConfig(num_epochs=2, num_minibatches=1, learning_rate=1e-3), **overrides
        )
        return make_ppo(cfg, net.apply, num_updates=10, axis_name=AXIS)
    cfg = dataclasses.replace(ImpalaConfig(num_minibatches=1, learning_rate=1e-3), **overrides)
    return make_impala(cfg, net.apply, num_updates=10, axis_name=AXIS)


def _assert_trees_close(a, b, atol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(
            np.asarray(x, np.float64), np.asarray(y, np.float64), atol=atol, rtol=0
        )


@pytest.mark.parametrize("algo_name,num_minibatches", [("ppo", 1), ("ppo", 4), ("impala", 1)])
@pytest.mark.parametrize(
    "discrete,check_vma",
    # check_vma=True makes jax.grad psum replicated-param gradients implicitly; False does
    # not. update() must give the same answer under both.
    [(True, True), (False, True), (True, False)],
)
def test_four_shards_equal_one_device(algo_name, num_minibatches, discrete, check_vma):
    net, params = small_network(discrete)
    # Shards get different numbers of valid steps, so local-count means would not match.
    traj = random_trajectory(net, params, discrete, T=8, B=8, seed=3)
    per_shard_valid = np.asarray(traj.valid).reshape(8, 4, 2).sum(axis=(0, 2))
    assert len(set(per_shard_valid.tolist())) > 1
    algo = _make(algo_name, net, num_minibatches=num_minibatches)
    state = algo.init(params)
    keys = jax.random.split(jax.random.PRNGKey(7), 8)  # one per env column

    state4, metrics4 = _sharded_update(algo, 4, check_vma)(state, traj, keys)
    state1, metrics1 = _sharded_update(algo, 1, check_vma)(state, traj, keys)

    assert int(state4.step) == int(state1.step) == 1
    moved = max(
        np.abs(np.asarray(a) - np.asarray(b)).max()
        for a, b in zip(jax.tree.leaves(state1.params), jax.tree.leaves(params))
    )
    assert moved > 1e-4  # the update did something
    _assert_trees_close(state4.params, state1.params, atol=1e-5)
    _assert_trees_close(state4.opt_state, state1.opt_state, atol=1e-5)
    truncation = {"clip_frac"} if algo_name == "ppo" else {"rho_truncated", "c_truncated"}
    assert (
        set(metrics4)
        == {
            "loss",
            "policy_loss",
            "value_loss",
            "entropy",
            "approx_kl",
            "grad_norm",
            "learning_rate",
            "finite",
        }
        | truncation
    )
    assert bool(metrics4["finite"]) and bool(metrics1["finite"])
    for name in metrics4:
        assert metrics4[name].shape == ()
        np.testing.assert_allclose(
            metrics4[name], metrics1[name], rtol=1e-4, atol=1e-5, err_msg=name
        )


def _updates_on_one_and_many(algo, params, traj, num_shards):
    """The update of `traj` on 1 learner device and on `num_shards`, with the same env keys:
    ((state, metrics) on one, (state, metrics) on many, how far one's update moved the
    params)."""
    state = algo.init(params)
    keys = jax.random.split(jax.random.PRNGKey(9), 8)
    one = _sharded_update(algo, 1)(state, traj, keys)
    many = _sharded_update(algo, num_shards)(state, traj, keys)
    moved = max(
        np.abs(np.asarray(a) - np.asarray(b)).max()
        for a, b in zip(jax.tree.leaves(one[0].params), jax.tree.leaves(params))
    )
    return one, many, moved


def _assert_same_update(one, many) -> None:
    """The same params (within summation order) and metrics from 1 device and from many."""
    (one_state, metrics1), (many_state, metrics_n) = one, many
    _assert_trees_close(many_state.params, one_state.params, atol=1e-5)
    for name in metrics1:
        np.testing.assert_allclose(
            metrics_n[name], metrics1[name], rtol=1e-4, atol=1e-5, err_msg=name
        )


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "num_shards,num_minibatches",
    # 8 envs: 4 shards hold 2 envs each, so 4 minibatches only divide 1 and 2 shards.
    [(2, 1), (4, 1), (2, 2), (4, 2), (2, 4)],
)
def test_impala_learner_count_does_not_change_the_update(num_shards, num_minibatches):
    """IMPALA minibatches are blocks of whole envs dealt by the envs' own keys, so 1, 2 or 4
    learner devices take the same optimizer steps on the same minibatches."""
    net, params = small_network(True)
    traj = random_trajectory(net, params, True, T=6, B=8, seed=4)
    algo = _make("impala", net, num_minibatches=num_minibatches, learning_rate=1e-2)
    one, many, moved = _updates_on_one_and_many(algo, params, traj, num_shards)
    assert moved > 1e-3
    # Shards sum the gradient in another order; RMSProp's first step divides by the
    # gradient's own size, so an element whose gradient is near 0 moves ~1e-6 apart on some
    # CPUs (seen on an AMD EPYC). A wrong reduction (pmean for psum) moves them 2e-3 apart.
    _assert_same_update(one, many)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("algo_name", ["ppo", "impala"])
@pytest.mark.parametrize("num_shards,num_minibatches", [(4, 1), (2, 2), (4, 2)])
def test_recurrent_learner_count_does_not_change_the_update(algo_name, num_shards, num_minibatches):
    """With a recurrent core both algorithms take minibatches of whole env sequences, each
    unrolled from its stamped state, so 1, 2 or 4 learner devices take the same steps."""
    net, params = small_network(True, core="lstm")
    traj = random_trajectory(net, params, True, T=6, B=8, seed=4)
    assert not np.asarray(traj.valid).all()  # resets inside the sequences
    rates = {"ppo": 1e-3, "impala": 1e-2}
    algo = _make(algo_name, net, num_minibatches=num_minibatches, learning_rate=rates[algo_name])
    one, many, moved = _updates_on_one_and_many(algo, params, traj, num_shards)
    assert moved > 1e-4
    _assert_same_update(one, many)


def test_shards_receive_different_keys():
    """The learner's key layout: one raw key per env ([B, 2]) sharded over the axis."""

    def per_shard(keys):
        return keys[:1], jax.random.uniform(keys[0], (1,))

    keys = jax.random.split(jax.random.PRNGKey(0), 8)
    fn = jax.jit(
        jax.shard_map(per_shard, mesh=_mesh(4), in_specs=P(AXIS), out_specs=(P(AXIS), P(AXIS)))
    )
    seen, draws = fn(keys)
    assert seen.shape == (4, 2)
    assert len({tuple(k) for k in np.asarray(seen).tolist()}) == 4
    assert len(set(np.asarray(draws).tolist())) == 4


@pytest.mark.parametrize("algo_name", ["ppo", "impala"])
def test_update_shuffles_with_each_shards_own_key(algo_name):
    """Every shard holds the same data. With the same keys on every shard each shard picks
    the same minibatches, so 4 shards equal 1 device on one shard's data; with distinct
    keys the shards pick different minibatches and the result differs."""
    net, params = small_network(True)
    local = random_trajectory(net, params, True, T=4, B=4, seed=5)
    tiled = Trajectory(
        *(
            jax.tree.map(
                lambda x, name=name: jnp.concatenate(
                    [x] * 4, axis=0 if name in ("last_obs", "last_value", "core_state") else 1
                ),
                x,
            )
            for name, x in zip(Trajectory._fields, local)
        )
    )
    # IMPALA's optimizer sees the summed loss, 4x larger on the tiled batch: without clip
    # and eps, RMSProp's step does not depend on that scale.
    scale_free = {} if algo_name == "ppo" else {"max_grad_norm": 1e9, "rmsprop_eps": 1e-12}
    algo = _make(algo_name, net, num_minibatches=2, **scale_free)
    state = algo.init(params)
    keys = jax.random.split(jax.random.PRNGKey(11), 4)  # one per local env

    reference, _ = _sharded_update(algo, 1)(state, local, keys)
    same, _ = _sharded_update(algo, 4)(state, tiled, jnp.concatenate([keys] * 4))
    distinct, _ = _sharded_update(algo, 4)(
        state, tiled, jax.random.split(jax.random.PRNGKey(12), 16)
    )

    _assert_trees_close(same.params, reference.params, atol=1e-5)
    gap = max(
        np.abs(np.asarray(a) - np.asarray(b)).max()
        for a, b in zip(jax.tree.leaves(distinct.params), jax.tree.leaves(reference.params))
    )
    assert gap > 1e-5


def test_ppo_loss_uses_global_statistics_under_shard_map():
    net, params = small_network(True)
    traj = random_trajectory(net, params, True, T=4, B=8, seed=6)
    # Keep the [T, B] layout so the env axis can be sharded; uneven valid counts per shard.
    mb = ppo_minibatch(traj, np.random.default_rng(1))
    mb = jax.tree.map(lambda x: x.reshape((4, 8) + x.shape[1:]), mb)
    cfg = PPOConfig()

    def sharded(p, m):
        share, metrics = ppo_loss(p, net.apply, m, cfg, AXIS)
        return jax.lax.psum(share, AXIS), metrics

    spec = jax.tree.map(lambda _: P(None, AXIS), mb)
    fn = jax.jit(jax.shard_map(sharded, mesh=_mesh(4), in_specs=(P(), spec), out_specs=(P(), P())))
    loss4, metrics4 = fn(params, mb)
    loss1, metrics1 = jax.jit(lambda p, m: ppo_loss(p, net.apply, m, cfg, None))(params, mb)
    np.testing.assert_allclose(loss4, loss1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loss4, metrics4["loss"], rtol=1e-5, atol=1e-6)
    for name in metrics1:
        np.testing.assert_allclose(
            metrics4[name], metrics1[name], rtol=1e-5, atol=1e-6, err_msg=name
        )
