"""The normalizer as the learner and the actors use it: behaviour statistics per rollout,
statistics published with the params, config checks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podrace.algos.normalization import (
    ReturnTracker,
    RunningStats,
    discounted_returns,
    update_stats,
)
from podrace.algos.normalizer import acting_apply, acting_params, init_normalizer, normalize_batch
from podrace.config import ConfigError, NormalizeConfig, TrainConfig, replace
from podrace.learner_mesh import make_mesh, make_normalize_fn, place_normalizer
from podrace.sync.local import LocalPublisher
from podrace.types import Trajectory
from podrace.validation import validate

T, B, D = 8, 4, 3
BOTH = NormalizeConfig(obs=True, reward=True, obs_clip=5.0, reward_clip=5.0)


def trajectory(seed: int, offset: float = 100.0) -> Trajectory:
    rng = np.random.default_rng(seed)
    obs = (offset + rng.normal(0.0, 2.0, (T, B, D))).astype(np.float32)
    f = rng.normal(1.0, 1.0, (T, B)).astype(np.float32)
    done = rng.random((T, B)) < 0.2
    valid = np.ones((T, B), bool)
    valid[1:] = ~done[:-1]
    obs[~valid] = 1e6  # autoreset steps: their obs must not enter the statistics
    return Trajectory(
        obs,
        np.zeros((T, B), np.int32),
        f,
        f,
        f,
        done,
        np.zeros((T, B), bool),
        valid,
        obs[-1],
        f[-1],
    )


def stats(mean: float, var: float) -> RunningStats:
    return RunningStats(
        jnp.float32(10.0), jnp.full((D,), mean, jnp.float32), jnp.full((D,), var, jnp.float32)
    )


@pytest.mark.timeout(60)
def test_each_rollout_is_normalized_with_its_behaviour_statistics():
    trajs = (trajectory(0), trajectory(1))
    behaviour = (
        stats(100.0, 4.0),
        stats(90.0, 1.0),
    )  # two actors that acted with different versions
    norm = init_normalizer(BOTH, (D,), 2 * B)
    new, out, finite = jax.jit(lambda n, t, b: normalize_batch(n, t, b, BOTH, 0.9))(
        norm, trajs, behaviour
    )
    assert finite
    for t, o, (mean, std) in zip(trajs, out, [(100.0, 2.0), (90.0, 1.0)]):
        expected = np.clip((t.obs - mean) / std, -5.0, 5.0)
        np.testing.assert_allclose(o.obs, expected, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(
            o.last_obs, np.clip((t.last_obs - mean) / std, -5, 5), rtol=1e-4, atol=1e-4
        )
        np.testing.assert_array_equal(o.values, t.values)  # behaviour values untouched
    # The statistics learn the raw valid observations, not the normalized ones.
    raw = np.concatenate([t.obs[t.valid] for t in trajs])
    np.testing.assert_allclose(new.obs.mean, raw.mean(0) * len(raw) / (len(raw) + 1e-4), rtol=1e-4)
    # Rewards: divided by the std of the discounted returns this batch updated.
    rewards = np.concatenate([t.rewards for t in trajs], 1)
    done = np.concatenate([t.terminated for t in trajs], 1)
    valid = np.concatenate([t.valid for t in trajs], 1)
    _, returns = discounted_returns(ReturnTracker(jnp.zeros(2 * B)), rewards, done, valid, 0.9)
    ret_stats = update_stats(norm.returns, returns, valid)
    scaled = np.concatenate([o.rewards for o in out], 1)
    np.testing.assert_allclose(
        scaled, np.clip(rewards / np.sqrt(ret_stats.var + 1e-8), -5, 5), rtol=1e-4
    )
    assert float(new.returns.count) == pytest.approx(valid.sum(), abs=1e-3)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "cfg",
    [BOTH, NormalizeConfig(obs=True), NormalizeConfig(reward=True)],
    ids=["both", "obs", "reward"],
)
def test_sharded_normalization_equals_one_device(cfg):
    """Two learner shards compute the statistics of the whole batch (psum), not of a half."""
    trajs = (trajectory(2), trajectory(3))
    behaviour = (stats(100.0, 4.0), stats(100.0, 4.0)) if cfg.obs else ()
    one = init_normalizer(cfg, (D,), 2 * B)
    ref, ref_out, _ = normalize_batch(one, trajs, behaviour, cfg, 0.9)
    mesh = make_mesh(jax.devices()[:2])
    two = place_normalizer(init_normalizer(cfg, (D,), 2 * B), mesh)
    fn = make_normalize_fn(cfg, 0.9, mesh, two, num_actors=2)
    got, got_out, finite = fn(two, trajs, behaviour)
    assert finite
    for a, b in zip(
        jax.tree.leaves((ref.obs, ref.returns)),
        jax.tree.leaves((got.obs, got.returns)),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5)
    for r, g in zip(ref_out, got_out):
        np.testing.assert_allclose(r.obs, g.obs, rtol=1e-5)
        np.testing.assert_allclose(r.rewards, g.rewards, rtol=1e-5)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("field", ["obs", "rewards"])
def test_one_non_finite_value_in_one_shard_makes_every_shard_report_non_finite_statistics(field):
    trajs = (trajectory(2), trajectory(3))
    bad = getattr(trajs[1], field).copy()
    bad[0, -1] = np.inf  # the last env of actor 1: on the second shard only
    trajs = (trajs[0], trajs[1]._replace(**{field: bad}))
    behaviour = (stats(100.0, 4.0), stats(100.0, 4.0))
    mesh = make_mesh(jax.devices()[:2])
    norm = place_normalizer(init_normalizer(BOTH, (D,), 2 * B), mesh)
    _, _, finite = make_normalize_fn(BOTH, 0.9, mesh, norm, num_actors=2)(norm, trajs, behaviour)
    assert not bool(finite)
    _, _, finite = normalize_batch(init_normalizer(BOTH, (D,), 2 * B), trajs, behaviour, BOTH, 0.9)
    assert not bool(finite)


@pytest.mark.timeout(60)
def test_statistics_travel_with_the_params_through_local_transport():
    def apply_fn(params, obs):
        return obs, obs @ params["w"]

    params = {"w": np.arange(D, dtype=np.float32)}
    norm = init_normalizer(NormalizeConfig(obs=True), (D,), B)._replace(obs=stats(50.0, 25.0))
    publisher = LocalPublisher()
    device = jax.devices()[1]
    subscriber = publisher.subscribe(device=device, name="actor")
    publisher.publish(acting_params(params, norm))
    snapshot = subscriber.get(min_version=0, timeout=10)
    assert set(snapshot.params) == {"params", "obs_stats"}
    for got, want in zip(snapshot.params["obs_stats"], norm.obs):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        assert got.devices() == {device}
    obs = jnp.full((B, D), 60.0)
    _, value = jax.jit(acting_apply(apply_fn, NormalizeConfig(obs=True)))(
        snapshot.params, jax.device_put(obs, device)
    )
    np.testing.assert_allclose(value, np.full(B, 2.0 * (0 + 1 + 2)), rtol=1e-5)  # (60 - 50) / 5 = 2
    publisher.close()
    # Without observation normalization the published pytree is the params themselves.
    assert acting_params(params, None) is params
    assert acting_params(params, init_normalizer(NormalizeConfig(reward=True), (D,), B)) is params


@pytest.mark.timeout(10)
@pytest.mark.parametrize("field", ["obs_clip", "reward_clip"])
@pytest.mark.parametrize("value", [0.0, -1.0])
def test_clip_values_must_be_positive(field, value):
    with pytest.raises(ConfigError) as exc:
        validate(replace(TrainConfig(), **{f"normalize.{field}": value}))
    assert str(exc.value) == f"normalize.{field} must be positive, got {value}"


@pytest.mark.timeout(60)
def test_bad_clip_on_the_command_line_is_one_line_and_exit_2(capsys, tmp_path):
    from podrace.cli import main

    code = main(
        [
            "train",
            "cartpole-ppo",
            "--log.run-dir",
            str(tmp_path),
            "--normalize.obs",
            "--normalize.obs-clip",
            "0",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "normalize.obs_clip must be positive, got 0.0" in err
    assert len(err.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


@pytest.mark.timeout(120)
def test_checkpoint_keeps_the_normalizer_and_eval_acts_with_its_statistics(tmp_path):
    """A RunState's normalizer slot round-trips through orbax, and `podrace eval` normalizes
    with the saved statistics as the run's actors did."""
    import dataclasses
    import json

    from podrace.checkpoints.files import Checkpointer
    from podrace.checkpoints.read import restore
    from podrace.checkpoints.state import abstract_run_state, checkpoint_dir
    from podrace.commands.eval import EvalOptions, evaluate_run
    from podrace.commands.playing import make_actor, play_episodes
    from podrace.envs import env_spec, make_env
    from podrace.networks import make_network
    from tests.helpers.checkpoints import fresh_state
    from tests.helpers.configs import tiny_config

    cfg = tiny_config(**{"normalize.obs": True, "normalize.reward": True})
    spec = env_spec(cfg.env)
    n = cfg.num_actors * cfg.env.num_envs
    norm = init_normalizer(cfg.normalize, spec.obs_shape, n)
    shifted = RunningStats(
        jnp.float32(50.0), jnp.asarray([0.5, -1.0, 0.05, 2.0]), jnp.asarray([0.01, 4.0, 0.001, 9.0])
    )
    norm = norm._replace(obs=shifted, tracker=ReturnTracker(jnp.arange(n, dtype=jnp.float32)))
    state = dataclasses.replace(fresh_state(cfg, version=2), normalizer=norm)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(dataclasses.asdict(cfg)))
    checkpointer = Checkpointer(checkpoint_dir(run), cfg, spec)
    checkpointer.save(state)
    checkpointer.close()

    restored = restore(checkpoint_dir(run), abstract_run_state(cfg, spec), spec)
    assert type(restored.normalizer) is type(norm)
    for a, b in zip(jax.tree.leaves(restored.normalizer), jax.tree.leaves(norm)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    result = evaluate_run(EvalOptions(run, episodes=4, seed=1))
    network = make_network(cfg.network, spec)
    params = state.train_state.params
    expected = {}
    for name, (apply, acting) in {
        "normalized": (acting_apply(network.apply, cfg.normalize), acting_params(params, norm)),
        "raw": (network.apply, params),
    }.items():
        env = make_env(cfg.env, 4, 1)
        expected[name] = (
            play_episodes(env, make_actor(apply, acting, False, 1), 4).result()[1].tolist()
        )
        env.close()
    assert expected["normalized"] != expected["raw"]  # the statistics change what is played
    assert json.loads(open(result["output"]).read())["lengths"] == expected["normalized"]
