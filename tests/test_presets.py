"""Presets: valid as shipped, runnable on one CPU device, documented, and the Atari ones
spell out the standard settings and the published hyperparameters they claim."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from podrace.algos.advantages import vtrace
from podrace.cli import main
from podrace.commands.train import parse_train
from podrace.envs import env_spec, resolve_backend
from podrace.learner_mesh import AXIS, TRAJECTORY_SPEC, make_algorithm, make_mesh
from podrace.presets import PRESETS
from podrace.types import Trajectory
from podrace.validation import validate
from tests.algos import numpy_reference as ref
from tests.algos.helpers import random_trajectory, small_network, summed_impala_loss

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


# (episodic life, no-ops, full action space, Breakout's actions): atari-ppo follows CleanRL's
# envs, atari-impala Cleanba's (Machado et al. 2018: no episodic life, all 18 actions).
ATARI_ENVS = {"atari-ppo": (True, 30, False, 4), "atari-impala": (False, 1, True, 18)}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", sorted(ATARI_ENVS))
def test_atari_presets_state_the_standard_settings(name):
    cfg = PRESETS[name][1]
    env = cfg.env
    assert env.id == "Breakout-v5" and env.backend == "envpool"
    assert (env.frame_skip, env.image_size, env.frame_stack) == (4, 84, 4)
    assert env.sticky_action_prob == 0.25 and env.reward_clip
    episodic_life, noop_max, full_action_space, num_actions = ATARI_ENVS[name]
    assert (env.episodic_life, env.noop_max, env.full_action_space) == (
        episodic_life,
        noop_max,
        full_action_space,
    )
    assert env.max_episode_steps == 108_000 // 4
    # 200M frames = 50M agent steps at frame skip 4.
    assert cfg.total_steps * env.frame_skip == 200_000_000
    spec = env_spec(env)
    assert (
        spec.obs_shape == (4, 84, 84)
        and spec.obs_dtype == np.uint8
        and spec.num_actions == num_actions
    )
    # The game is overridable; every other setting stays.
    other = dataclasses.replace(env, id="Pong-v5")
    validate(dataclasses.replace(cfg, env=other))
    assert resolve_backend(other) == "envpool" and env_spec(other).num_actions == (
        18 if full_action_space else 6
    )


@pytest.mark.timeout(30)
def test_atari_impala_follows_cleanba():
    """cleanba_impala.py's Args and make_env, written out."""
    cfg = PRESETS["atari-impala"][1]
    imp = cfg.impala
    assert cfg.network.torso == "impala_resnet" and cfg.network.hidden_sizes == (256,)
    assert (cfg.rollout_length, cfg.num_actors, cfg.env.num_envs, imp.num_minibatches) == (
        20,
        2,
        64,
        4,
    )
    assert cfg.total_steps == 50_000_000
    assert (imp.learning_rate, imp.anneal_lr, imp.gamma, imp.vtrace_lambda) == (
        6e-4,
        True,
        0.99,
        1.0,
    )
    assert (imp.ent_coef, imp.vf_coef, imp.rho_bar, imp.c_bar) == (0.01, 0.5, 1.0, 1.0)
    assert (imp.rmsprop_style, imp.rmsprop_eps, imp.rmsprop_decay, imp.max_grad_norm) == (
        "torch",
        0.01,
        0.99,
        40.0,
    )
    assert cfg.layout.scan_unroll >= imp.num_minibatches  # fully unrolled (see the benchmark)


@pytest.mark.timeout(30)
def test_atari_ppo_follows_cleanrl():
    cfg = PRESETS["atari-ppo"][1]
    ppo = cfg.ppo
    assert cfg.network.torso == "nature_cnn" and cfg.network.hidden_sizes == (512,)
    assert cfg.rollout_length == 128
    assert (ppo.learning_rate, ppo.anneal_lr, ppo.num_epochs, ppo.num_minibatches) == (
        2.5e-4,
        True,
        4,
        4,
    )
    assert (ppo.clip_coef, ppo.ent_coef, ppo.vf_coef, ppo.max_grad_norm) == (0.1, 0.01, 0.5, 0.5)
    assert (ppo.gamma, ppo.gae_lambda) == (0.99, 0.95)
    assert cfg.layout.scan_unroll >= max(ppo.num_epochs, ppo.num_minibatches)


def cleanba_summed_loss_gradient(net, params, traj, imp):
    """Gradient of Cleanba's loss: the per-step IMPALA loss SUMMED over valid steps."""
    dist, values = net.apply(params, traj.obs)
    _, last_value = net.apply(params, traj.last_obs)
    vs, pg = vtrace(
        traj.logprobs,
        dist.log_prob(traj.actions),
        traj.rewards,
        values,
        last_value,
        traj.terminated,
        traj.truncated,
        traj.valid,
        imp.gamma,
        imp.vtrace_lambda,
        imp.rho_bar,
        imp.c_bar,
    )
    return jax.grad(summed_impala_loss(net, traj, vs, pg, imp))(params)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "argv",
    [["atari-impala"], ["atari-ppo", "--algo", "impala"], ["cartpole-ppo", "--algo", "impala"]],
)
def test_every_way_of_selecting_impala_gets_cleanbas_optimizer(argv):
    """One update of the configured learner (its own T, envs and minibatches; a small
    network) equals Cleanba's: per minibatch, the summed-loss gradient clipped to norm 40,
    then PyTorch RMSProp (eps 0.01 outside the sqrt, decay 0.99) at lr 6e-4. Every env
    column holds the same data, so every minibatch is the same whatever the shuffle."""
    cfg = parse_train(argv)
    validate(cfg)
    assert cfg.algo == "impala"
    net, params = small_network(True)
    num_envs = cfg.num_actors * cfg.env.num_envs
    num_mb = cfg.impala.num_minibatches
    column = random_trajectory(net, params, True, T=cfg.rollout_length, B=1, seed=2)
    assert np.asarray(column.valid).sum() >= cfg.rollout_length // 2

    def tile(name, x, n):
        axis = 0 if name in ("last_obs", "last_value", "core_state") else 1
        return jax.tree.map(lambda leaf: jnp.repeat(leaf, n, axis=axis), x)

    traj = Trajectory(*(tile(n, x, num_envs) for n, x in zip(Trajectory._fields, column)))
    minibatch = Trajectory(
        *(tile(n, x, num_envs // num_mb) for n, x in zip(Trajectory._fields, column))
    )

    algo = make_algorithm(cfg, net.apply)
    update = jax.jit(
        jax.shard_map(
            algo.update,
            mesh=make_mesh(jax.devices()[:1]),
            in_specs=(P(), TRAJECTORY_SPEC, P(AXIS)),
            out_specs=(P(), P()),
        )
    )
    state, _ = update(algo.init(params), traj, jax.random.split(jax.random.PRNGKey(0), num_envs))

    grad_fn = jax.jit(lambda p: cleanba_summed_loss_gradient(net, p, minibatch, cfg.impala))
    expected, treedef = jax.tree.leaves(params), jax.tree.structure(params)
    grads = []
    for _ in range(num_mb):  # the reference walks the same minibatch num_mb times
        grads.append(
            [np.asarray(g) for g in jax.tree.leaves(grad_fn(jax.tree.unflatten(treedef, expected)))]
        )
        expected = ref.rmsprop(
            jax.tree.leaves(params),
            grads,
            [6e-4] * len(grads),
            decay=0.99,
            eps=0.01,
            max_norm=40.0,
            style="torch",
        )
    got = jax.tree.leaves(state.params)
    moved = max(
        np.abs(np.asarray(a) - np.asarray(b)).max() for a, b in zip(got, jax.tree.leaves(params))
    )
    assert moved > 1e-3
    for g, e in zip(got, expected):
        np.testing.assert_allclose(np.asarray(g), e, rtol=1e-4, atol=2e-6)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["minatar-ppo", "minatar-impala"])
def test_a_minatar_preset_serves_every_game_with_the_papers_network(name):
    """One preset for the five games, at the MinAtar paper's budget, with the package's
    dynamics (no overrides of its defaults) and the paper's network."""
    pytest.importorskip("minatar")
    from podrace.envs.minatar import GAMES
    from podrace.networks import make_network

    cfg = PRESETS[name][1]
    assert (cfg.env.id, cfg.env.backend, cfg.total_steps) == (
        "MinAtar/Breakout-v1",
        "gymnasium",
        5_000_000,
    )
    assert (cfg.network.torso, cfg.network.hidden_sizes) == ("minatar_cnn", (128,))
    assert cfg.env.max_episode_steps is None and cfg.env.obs_indices is None
    for game in GAMES:
        changed = dataclasses.replace(
            cfg, env=dataclasses.replace(cfg.env, id=f"MinAtar/{game}-v1")
        )
        validate(changed)
        spec = env_spec(changed.env)
        net = make_network(changed.network, spec)
        obs = jnp.zeros((2, *spec.obs_shape), spec.obs_dtype)
        dist, value = net.apply(net.init(jax.random.PRNGKey(0), obs), obs)
        assert dist.logits.shape == (2, spec.num_actions) and value.shape == (2,)
