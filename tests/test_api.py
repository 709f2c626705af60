"""The public Python API: cheap import, lazy names, presets.get, podrace.train's validation,
and the halfcheetah-ppo preset."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

import podrace
from podrace.presets import PRESETS


@pytest.mark.timeout(60)
def test_import_and_configs_do_not_import_jax():
    code = (
        "import sys, dataclasses, podrace, podrace.validation\n"
        "cfg = podrace.presets.get('cartpole-ppo')\n"
        "cfg = dataclasses.replace(cfg, env=podrace.EnvConfig(id='CartPole-v1'), layout=podrace.LayoutConfig())\n"
        "podrace.validation.validate(cfg); podrace.TrainConfig; podrace.ConfigError\n"
        "heavy = sorted({'jax', 'numpy', 'gymnasium', 'envpool', 'flax'} & set(sys.modules))\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.timeout(60)
def test_every_public_name_resolves():
    for name in podrace.__all__:
        assert getattr(podrace, name) is not None, name
    assert podrace.TrainConfig is podrace.config.TrainConfig
    assert podrace.sync.LocalPublisher is not None and podrace.sync.Snapshot is not None
    assert set(podrace.__all__) <= set(dir(podrace))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        podrace.nope  # noqa: B018


@pytest.mark.timeout(30)
def test_presets_get_returns_a_config_to_replace():
    cfg = podrace.presets.get("cartpole-ppo")
    assert isinstance(cfg, podrace.TrainConfig) and cfg is PRESETS["cartpole-ppo"][1]
    changed = dataclasses.replace(cfg, seed=7, env=dataclasses.replace(cfg.env, num_envs=4))
    assert (changed.seed, changed.env.num_envs) == (7, 4)
    assert podrace.presets.get("cartpole-ppo").env.num_envs == 64  # the preset is untouched
    with pytest.raises(podrace.ConfigError) as info:
        podrace.presets.get("cartpole")
    assert str(info.value) == f"unknown preset 'cartpole'; presets: {', '.join(sorted(PRESETS))}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "change,factory,message",
    [
        ({"id": "NoSuchEnv-v0"}, None, "unknown env id"),
        ({"id": "no_such_user_module:Env-v0"}, None, "cannot import module 'no_such_user_module'"),
        ({}, lambda n, s: "not an env", "returned str"),
    ],
)
def test_train_raises_config_error_before_writing(tmp_path, change, factory, message):
    base = podrace.presets.get("cartpole-ppo")
    cfg = dataclasses.replace(
        base, env=dataclasses.replace(base.env, **change), log=dataclasses.replace(base.log, run_dir=str(tmp_path))
    )
    with pytest.raises(podrace.ConfigError, match=message):
        podrace.train(cfg, env_factory=factory)
    assert not list(tmp_path.iterdir())


# --- halfcheetah-ppo --------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_halfcheetah_ppo_follows_cleanrl_ppo_continuous_action():
    cfg = podrace.presets.get("halfcheetah-ppo")
    ppo = cfg.ppo
    assert (cfg.env.id, cfg.env.backend, cfg.total_steps) == ("HalfCheetah-v4", "envpool", 1_000_000)
    assert (cfg.num_actors, cfg.env.num_envs, cfg.rollout_length) == (1, 1, 2048)
    assert (ppo.learning_rate, ppo.anneal_lr, ppo.num_epochs, ppo.num_minibatches) == (3e-4, True, 10, 32)
    assert (ppo.clip_coef, ppo.clip_value_loss, ppo.ent_coef, ppo.vf_coef, ppo.max_grad_norm) == (0.2, True, 0.0, 0.5, 0.5)
    assert (ppo.gamma, ppo.gae_lambda, ppo.norm_adv) == (0.99, 0.95, True)
    assert cfg.normalize == podrace.NormalizeConfig(obs=True, obs_clip=10.0, reward=True, reward_clip=10.0)
    net = cfg.network
    assert (net.torso, net.hidden_sizes, net.activation, net.shared_torso) == ("mlp", (64, 64), "tanh", False)
    spec = podrace.envs.env_spec(cfg.env)  # envpool ships MuJoCo: no mujoco package needed
    assert spec.obs_shape == (17,) and not spec.discrete and spec.action_shape == (6,)
    np.testing.assert_array_equal(spec.action_low, -np.ones(6))
    np.testing.assert_array_equal(spec.action_high, np.ones(6))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_halfcheetah_ppo_trains_on_envpool_mujoco(tmp_path):
    """The preset's env and network end to end, with a smaller rollout and shorter episodes."""
    cfg = podrace.presets.get("halfcheetah-ppo")
    cfg = dataclasses.replace(
        cfg,
        total_steps=512,
        rollout_length=256,
        env=dataclasses.replace(cfg.env, max_episode_steps=100),
        ppo=dataclasses.replace(cfg.ppo, num_epochs=2, num_minibatches=4),
        eval=dataclasses.replace(cfg.eval, episodes=1, num_envs=1),
        log=dataclasses.replace(cfg.log, run_dir=str(tmp_path), console="none"),
    )
    result = podrace.train(cfg)
    assert result.updates == 2 and result.env_steps == 512
    assert np.isfinite(result.final_eval.mean_return) and result.final_eval.lengths.tolist() == [100]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_with_a_vector_env_factory_learns_beyond_random(tmp_path):
    """Actors and the evaluator build their envs with the factory (the id is never used)."""
    import gymnasium

    from tests.envs.user_envs import MATCH_LENGTH, RANDOM_RETURN, MatchEnv

    def factory(num_envs: int, seed: int) -> gymnasium.vector.VectorEnv:
        return gymnasium.vector.SyncVectorEnv([MatchEnv] * num_envs)

    base = podrace.presets.get("cartpole-ppo")
    cfg = dataclasses.replace(
        base,
        total_steps=8192,
        env=dataclasses.replace(base.env, id="not-used-with-a-factory"),
        eval=dataclasses.replace(base.eval, episodes=16),
        log=dataclasses.replace(base.log, run_dir=str(tmp_path), console="none"),
    )
    result = podrace.train(cfg, env_factory=factory)
    assert result.final_eval.mean_return >= 0.75 * MATCH_LENGTH > 2 * RANDOM_RETURN
