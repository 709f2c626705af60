"""The learner mesh's programs: 1, 2 and 4 learner devices give the same update, every env
keeps its key whatever the learner count, placement gives each device its slice."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from podrace.config import (
    EnvConfig,
    ImpalaConfig,
    LayoutConfig,
    NetworkConfig,
    PPOConfig,
    TrainConfig,
)
from podrace.envs import env_spec
from podrace.learner_mesh import (
    AXIS,
    LearnerPlacement,
    env_keys,
    make_mesh,
    trajectory_shardings,
)
from podrace.networks import make_network
from podrace.types import Trajectory
from tests import trajectories
from tests.helpers.learners import sharded_update

T, B, ACTORS = trajectories.ROLLOUT_LENGTH, trajectories.ENVS, 2


def fields(traj):
    """(field name, leaf) of every array of a Trajectory (a core state has one per leaf)."""
    return [
        (name, leaf) for name in Trajectory._fields for leaf in jax.tree.leaves(getattr(traj, name))
    ]


def one_update(cfg, num_learners, host_trajs):
    sharded = sharded_update(cfg, jax.devices()[:num_learners], ACTORS)
    trajs = tuple(sharded.placement.place(jax.device_put(t, jax.devices()[0])) for t in host_trajs)
    keys = env_keys(jax.random.PRNGKey(1), ACTORS, B, sharded.mesh)
    new_state, _, metrics = sharded.update(sharded.state, trajs, keys)
    if num_learners > 1:  # one learner device takes a rollout made there as it is
        assert trajs[0].obs.sharding.spec == P(None, AXIS)
    assert len(trajs[0].obs.addressable_shards) == num_learners
    return jax.device_get(new_state.params), jax.device_get(metrics)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("algo", ["ppo", "impala"])
@pytest.mark.parametrize("core", ["none", "lstm"])
def test_four_learner_devices_match_one(algo, core):
    """Also with a recurrent core: rollouts stamped with their start states, PPO's
    minibatches of whole env sequences (2 per epoch: every shard of 4 holds 4 envs)."""
    cfg = TrainConfig(
        algo=algo,
        env=EnvConfig(id="CartPole-v1", num_envs=B),
        network=NetworkConfig(hidden_sizes=(16, 16), core=core, core_size=8),
        ppo=PPOConfig(num_epochs=2, num_minibatches=4 if core == "none" else 2),
        impala=ImpalaConfig(num_minibatches=1),
        layout=LayoutConfig(actors_per_device=ACTORS),
        rollout_length=T,
        total_steps=T * B * ACTORS * 10,
    )
    rng = np.random.default_rng(0)
    spec = env_spec(cfg.env)
    host = [trajectories.actor_trajectory(rng, spec, cfg.network) for _ in range(ACTORS)]
    params_1, metrics_1 = one_update(cfg, 1, host)
    params_4, metrics_4 = one_update(cfg, 4, host)
    for a, b in zip(jax.tree.leaves(params_1), jax.tree.leaves(params_4)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(metrics_1["loss"], metrics_4["loss"], rtol=1e-4, atol=1e-5)
    moved = [
        np.abs(a - b).max()
        for a, b in zip(
            jax.tree.leaves(params_1),
            jax.tree.leaves(
                jax.device_get(
                    make_network(cfg.network, spec).init(
                        jax.random.PRNGKey(0), np.zeros((1, 4), np.float32)
                    )
                )
            ),
        )
    ]
    assert max(moved) > 0  # the update did something


def test_every_learner_shard_draws_from_its_own_keys():
    mesh = make_mesh(jax.devices()[:4])
    keys = env_keys(jax.random.PRNGKey(0), ACTORS, B, mesh)

    def draw(keys):
        return jax.random.uniform(keys[0], (1,))

    draws = jax.jit(jax.shard_map(draw, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS)))(keys)
    draws = np.asarray(jax.device_get(draws))
    assert len(set(draws.tolist())) == 4


def test_an_envs_key_does_not_depend_on_the_learner_count():
    """Env (a, j) is column j * ACTORS + a of the batch for any learner count (shard d holds
    its slice of every actor's envs, env by env), and its key sits in the same row."""
    keys = jax.random.split(jax.random.PRNGKey(0), ACTORS * B)
    one = np.asarray(
        jax.device_get(env_keys(jax.random.PRNGKey(0), ACTORS, B, make_mesh(jax.devices()[:1])))
    )
    four = np.asarray(
        jax.device_get(env_keys(jax.random.PRNGKey(0), ACTORS, B, make_mesh(jax.devices()[:4])))
    )
    np.testing.assert_array_equal(four, one)
    for a in range(ACTORS):
        for j in range(B):
            np.testing.assert_array_equal(one[j * ACTORS + a], keys[a * B + j])
    assert len({tuple(k) for k in one.tolist()}) == ACTORS * B


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("num_minibatches", [2, 4])
def test_impala_minibatches_of_several_actors_do_not_depend_on_the_learner_count(num_minibatches):
    """IMPALA minibatches are blocks of consecutive env columns; the batch's column order
    (env-major across actors) is the same for 1, 2 and 4 learners, so the blocks are too."""
    cfg = TrainConfig(
        algo="impala",
        env=EnvConfig(id="CartPole-v1", num_envs=B),
        network=NetworkConfig(hidden_sizes=(16, 16)),
        impala=ImpalaConfig(num_minibatches=num_minibatches),
        layout=LayoutConfig(actors_per_device=ACTORS),
        rollout_length=T,
        total_steps=T * B * ACTORS * 10,
    )
    rng = np.random.default_rng(1)
    host = [trajectories.actor_trajectory(rng, env_spec(cfg.env)) for _ in range(ACTORS)]
    params_1, metrics_1 = one_update(cfg, 1, host)
    for learners in (2, 4):
        params_n, metrics_n = one_update(cfg, learners, host)
        for a, b in zip(jax.tree.leaves(params_1), jax.tree.leaves(params_n)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(metrics_1["loss"], metrics_n["loss"], rtol=1e-4, atol=1e-5)


@pytest.mark.timeout(60)
def test_placement_gives_each_learner_device_its_slice_of_the_envs():
    mesh = make_mesh(jax.devices()[:4])
    placement = LearnerPlacement(*trajectory_shardings(mesh))
    spec = env_spec(EnvConfig(id="CartPole-v1", num_envs=B))
    host = trajectories.actor_trajectory(np.random.default_rng(0), spec, NetworkConfig(core="lstm"))
    placed = placement.place(jax.device_put(host, jax.devices()[0]))
    assert len(fields(placed)) == len(fields(host)) == 12  # the LSTM's state: 2 arrays
    for (name, global_array), (_, expected_whole) in zip(fields(placed), fields(host)):
        np.testing.assert_array_equal(np.asarray(global_array), expected_whole, err_msg=name)
        env_axis = 0 if name in ("last_obs", "last_value", "core_state") else 1
        for shard in global_array.addressable_shards:
            d = mesh.devices.flat[:].tolist().index(shard.device)
            expected = np.take(expected_whole, range(d * B // 4, (d + 1) * B // 4), axis=env_axis)
            np.testing.assert_array_equal(np.asarray(shard.data), expected, err_msg=name)


@pytest.mark.timeout(60)
def test_one_learner_device_takes_a_rollout_made_there_as_it_is_and_moves_others():
    learner_device, other = jax.devices()[:2]
    placement = LearnerPlacement(*trajectory_shardings(make_mesh([learner_device])))
    host = trajectories.actor_trajectory(
        np.random.default_rng(0),
        env_spec(EnvConfig(id="CartPole-v1", num_envs=B)),
        NetworkConfig(core="gru"),
    )
    made_there = jax.device_put(host, learner_device)
    placed = placement.place(made_there)  # a CPU actor sharing the learner's device: no copy
    assert len(fields(placed)) == 11  # the GRU's state: 1 array
    for (name, got), (_, src) in zip(fields(placed), fields(made_there)):
        assert (
            got.devices() == {learner_device}
            and got.unsafe_buffer_pointer() == src.unsafe_buffer_pointer()
        ), name
    for source in (jax.device_put(host, other), host):  # another device's rollout, a host one (Ray)
        placed = placement.place(source)
        for (name, got), (_, expected) in zip(fields(placed), fields(host)):
            assert got.devices() == {learner_device}, name
            np.testing.assert_array_equal(np.asarray(got), expected, err_msg=name)
