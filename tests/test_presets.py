"""Presets: valid as shipped, runnable on one CPU device, documented, and the Atari ones
spell out the standard settings and the published hyperparameters they claim."""

import dataclasses

import jax
import numpy as np
import optax
import pytest

from podrace.algos.impala import impala_loss, make_impala
from podrace.cli import main
from podrace.config import ImpalaConfig, validate
from podrace.envs import env_spec, resolve_backend
from podrace.presets import PRESETS, mean_loss_rmsprop
from tests.algos.helpers import random_trajectory, small_network

NAMES = sorted(PRESETS)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", NAMES)
def test_preset_is_valid_and_runs_on_one_cpu_device(name):
    description, cfg = PRESETS[name]
    validate(cfg)
    assert cfg.name == name
    assert len(description) > 30 and description[0].isupper()
    layout = cfg.layout
    assert layout.cpu_devices == 1 and layout.platform is None
    assert layout.actor_device_ids == (0,) and layout.learner_device_ids == (0,)
    assert cfg.eval.device_id is None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", NAMES)
def test_train_help_works_for_every_preset(capsys, name):
    with pytest.raises(SystemExit) as exc:
        main(["train", name, "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"podrace train {name}" in out
    assert PRESETS[name][0].split(";")[0].split(",")[0] in out  # the description is shown
    for flag in ("--env.id", "--total-steps", f"--{PRESETS[name][1].algo}.learning-rate"):
        assert flag in out


@pytest.mark.timeout(30)
def test_required_presets_exist():
    assert {"atari-ppo", "atari-impala", "cartpole-impala"} <= set(PRESETS)
    assert PRESETS["cartpole-impala"][1].algo == "impala"
    assert PRESETS["atari-impala"][1].algo == "impala"
    assert PRESETS["atari-ppo"][1].algo == "ppo"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", ["atari-ppo", "atari-impala"])
def test_atari_presets_state_the_standard_settings(name):
    cfg = PRESETS[name][1]
    env = cfg.env
    assert env.id == "Breakout-v5" and env.backend == "envpool"
    assert (env.frame_skip, env.image_size, env.frame_stack) == (4, 84, 4)
    assert env.sticky_action_prob == 0.25 and not env.full_action_space
    assert env.episodic_life and env.reward_clip
    assert env.max_episode_steps == 108_000 // 4
    # 200M frames = 50M agent steps at frame skip 4.
    assert cfg.total_steps * env.frame_skip == 200_000_000
    spec = env_spec(env)
    assert spec.obs_shape == (4, 84, 84) and spec.obs_dtype == np.uint8 and spec.num_actions == 4
    # The game is overridable; every other setting stays.
    other = dataclasses.replace(env, id="Pong-v5")
    validate(dataclasses.replace(cfg, env=other))
    assert resolve_backend(other) == "envpool" and env_spec(other).num_actions == 6


@pytest.mark.timeout(30)
def test_atari_impala_follows_the_paper():
    cfg = PRESETS["atari-impala"][1]
    imp = cfg.impala
    assert cfg.network.torso == "impala_resnet" and cfg.network.hidden_sizes == (256,)
    assert cfg.rollout_length == 20
    envs_per_minibatch = cfg.num_actors * cfg.env.num_envs // imp.num_minibatches
    assert envs_per_minibatch == 32  # the paper's batch of 32 unrolls
    assert (imp.learning_rate, imp.anneal_lr, imp.gamma) == (6e-4, True, 0.99)
    assert (imp.ent_coef, imp.vf_coef, imp.rho_bar, imp.c_bar, imp.rmsprop_decay) == (0.01, 0.5, 1.0, 1.0, 0.99)
    samples = envs_per_minibatch * cfg.rollout_length
    assert imp.rmsprop_eps * samples**2 == pytest.approx(0.01)
    assert imp.max_grad_norm * samples == pytest.approx(40.0)
    assert cfg.layout.scan_unroll >= imp.num_minibatches  # fully unrolled (see the benchmark)


@pytest.mark.timeout(30)
def test_atari_ppo_follows_cleanrl():
    cfg = PRESETS["atari-ppo"][1]
    ppo = cfg.ppo
    assert cfg.network.torso == "nature_cnn" and cfg.network.hidden_sizes == (512,)
    assert cfg.rollout_length == 128
    assert (ppo.learning_rate, ppo.anneal_lr, ppo.num_epochs, ppo.num_minibatches) == (2.5e-4, True, 4, 4)
    assert (ppo.clip_coef, ppo.ent_coef, ppo.vf_coef, ppo.max_grad_norm) == (0.1, 0.01, 0.5, 0.5)
    assert (ppo.gamma, ppo.gae_lambda) == (0.99, 0.95)
    assert cfg.layout.scan_unroll >= max(ppo.num_epochs, ppo.num_minibatches)


@pytest.mark.timeout(120)
def test_mean_loss_rmsprop_reproduces_the_summed_loss_update():
    """make_impala with converted eps/clip == RMSProp(eps, clip) on the summed IMPALA loss.

    The clip binds and eps is as large as the first RMSProp second moment of the clipped
    summed gradient, so both matter; kept unconverted with a mean loss, that eps swamps
    the (samples times smaller) gradients and the step is several times smaller.
    """
    net, params = small_network(True)
    traj = random_trajectory(net, params, True, T=8, B=8, seed=5)
    samples = int(np.asarray(traj.valid).sum())
    lr, decay = 1e-2, 0.9
    base = ImpalaConfig(learning_rate=lr, anneal_lr=False, num_minibatches=1, rmsprop_decay=decay)

    def summed(p):
        return impala_loss(p, net.apply, traj, base, None)[0] * samples

    grads = jax.grad(summed)(params)
    # A clip that binds on the summed gradient but would not on the mean one.
    clip_sum = float(optax.tree.norm(grads)) / np.sqrt(samples)
    num_params = sum(x.size for x in jax.tree.leaves(grads))
    eps_sum = (1 - decay) * (clip_sum**2 / num_params)  # ~ the mean first second moment
    paper = optax.chain(optax.clip_by_global_norm(clip_sum), optax.rmsprop(lr, decay=decay, eps=eps_sum, eps_in_sqrt=True))
    updates, _ = paper.update(grads, paper.init(params), params)
    expected = optax.apply_updates(params, updates)

    def ours(eps, clip):
        cfg = dataclasses.replace(base, rmsprop_eps=eps, max_grad_norm=clip)
        algo = make_impala(cfg, net.apply, 10, None)
        keys = jax.random.split(jax.random.PRNGKey(0), traj.last_value.shape[0])
        return jax.jit(algo.update)(algo.init(params), traj, keys)[0].params

    converted = ours(*mean_loss_rmsprop(eps_sum, clip_sum, samples))
    for a, b in zip(jax.tree.leaves(converted), jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-7)
    unconverted = ours(eps_sum, clip_sum)
    step = lambda p: sum(float(np.abs(np.asarray(x) - np.asarray(y)).sum())
                         for x, y in zip(jax.tree.leaves(p), jax.tree.leaves(params)))
    assert step(unconverted) < 0.3 * step(converted)
