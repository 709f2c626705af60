"""The jax backend: ids, next-step autoreset and episode statistics, and bad input stopped
with one line and exit 2 before any thread starts."""

from __future__ import annotations

import sys

import jax
import numpy as np
import pytest

from podrace.config import ConfigError, EnvConfig
from podrace.envs import device_env, env_spec, make_env, resolve_backend
from podrace.envs.device_env import DeviceEnv
from tests.helpers.cli import run_cli

from .jax_user_envs import CLASSES, RESETS

GUESS = "tests.envs.jax_user_envs:guess"


@pytest.mark.parametrize(
    "env_id,backend,expected",
    [
        ("gymnax:CartPole-v1", "auto", "jax"),
        ("gymnax:CartPole-v1", "jax", "jax"),
        ("craftax:Craftax-Classic-Symbolic-v1", "auto", "jax"),
        (GUESS, "jax", "jax"),
        ("CartPole-v1", "auto", "envpool"),
    ],
)
def test_ids_resolve_to_the_jax_backend(env_id, backend, expected):
    assert resolve_backend(EnvConfig(id=env_id, backend=backend)) == expected


def test_gymnax_cartpole_spec_and_envs():
    cfg = EnvConfig(id="gymnax:CartPole-v1")
    spec = env_spec(cfg)
    assert (spec.obs_shape, spec.obs_dtype, spec.num_actions) == ((4,), np.float32, 2)
    env = make_env(cfg, 3, seed=5)
    assert isinstance(env, DeviceEnv) and env.spec == spec
    obs = env.reset()
    assert obs.shape == (3, 4) and obs.dtype == np.float32
    again = make_env(cfg, 3, seed=5).reset()
    np.testing.assert_array_equal(obs, again)  # deterministic given the seed
    assert not np.array_equal(obs, make_env(cfg, 3, seed=6).reset())


def step_guess(num_envs: int, steps: int, seed: int, max_steps: int | None = None):
    env = make_env(EnvConfig(id=GUESS, backend="jax", max_episode_steps=max_steps), num_envs, seed)
    env.reset()
    rng = np.random.default_rng(seed)
    return [env.step(rng.integers(CLASSES, size=num_envs).astype(np.int32)) for _ in range(steps)]


def test_next_step_autoreset_and_episode_statistics():
    steps = step_guess(num_envs=6, steps=60, seed=1)
    ended = np.zeros(6, bool)
    running_return, running_length = np.zeros(6), np.zeros(6, int)
    resets = 0
    for step in steps:
        # the step after an ended one is a reset: reward 0, nothing ends, not counted
        assert not step.reward[ended].any()
        assert not (step.terminated | step.truncated)[ended].any()
        resets += ended.sum()
        running_return = np.where(ended, 0, running_return) + step.reward
        running_length = np.where(ended, 0, running_length) + ~ended
        done = step.terminated | step.truncated
        np.testing.assert_array_equal(step.episode_done, done)
        np.testing.assert_allclose(step.episode_return[done], running_return[done])
        np.testing.assert_array_equal(step.episode_length[done], running_length[done])
        assert (step.episode_length[done] <= 5).all()
        ended = done
    assert resets > 10
    truncated = np.array([s.truncated for s in steps])
    terminated = np.array([s.terminated for s in steps])
    assert truncated.any() and terminated.any()
    assert not (truncated & terminated).any()


def test_a_step_computes_the_resets_of_the_envs_that_ended_only():
    """An env's reset can cost many of its steps (Craftax generates a world): a step resets
    the envs whose last step ended, and no other env."""
    env = make_env(EnvConfig(id="tests.envs.jax_user_envs:counted_guess", backend="jax"), 8, 4)
    env.reset()
    jax.effects_barrier()
    RESETS.clear()
    rng = np.random.default_rng(4)
    ended, resets = np.zeros(8, bool), 0
    for _ in range(30):
        step = env.step(rng.integers(CLASSES, size=8).astype(np.int32))
        jax.effects_barrier()
        resets += int(ended.sum())
        assert len(RESETS) == resets
        ended = step.terminated | step.truncated
    assert resets > 10


@pytest.mark.parametrize("divisor", [1, 13, 64])  # blocks of 130, 10 (the last overlaps), 2
def test_resets_in_blocks_step_as_resets_one_env_at_a_time(monkeypatch, divisor):
    """A step resets its ended envs a block at a time (the last block may overlap the one
    before it): the episodes are those of resetting one env at a time (observations up to
    the last bits of float32: XLA vectorizes a batch of one env differently)."""
    monkeypatch.setattr(device_env, "RESET_BLOCK_DIVISOR", 130)
    one_at_a_time = step_guess(num_envs=130, steps=12, seed=3)
    monkeypatch.setattr(device_env, "RESET_BLOCK_DIVISOR", divisor)
    in_blocks = step_guess(num_envs=130, steps=12, seed=3)
    for a, b in zip(one_at_a_time, in_blocks):
        np.testing.assert_allclose(a.obs, b.obs, rtol=1e-5, atol=1e-5)
        for name in ("reward", "terminated", "truncated", "episode_return"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def test_max_episode_steps_sets_the_time_limit():
    steps = step_guess(num_envs=8, steps=40, seed=2, max_steps=2)
    lengths = np.concatenate([s.episode_length[s.episode_done] for s in steps])
    assert lengths.max() == 2 and any(s.truncated.any() for s in steps)


def test_same_seed_same_episodes():
    a, b = step_guess(4, 20, seed=3), step_guess(4, 20, seed=3)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.obs, y.obs)


@pytest.mark.parametrize(
    "env_id,message",
    [
        ("gymnax:NoSuch-v0", "gymnax has no env 'NoSuch-v0'"),
        ("craftax:NoSuch-v0", "needs the craftax package: pip install 'podrace[craftax]'"),
        ("tests.envs.jax_user_envs:guess_only_env", "returned Guess; expected (env, params)"),
        ("tests.envs.jax_user_envs:not_an_env", "lacks reset_env, step_env"),
        ("tests.envs.jax_user_envs:unjittable", "its step_env cannot be jitted"),
        ("tests.envs.jax_user_envs:no_such_factory", "has no callable 'no_such_factory'"),
        ("CartPole-v1", "must be 'gymnax:<name>', 'craftax:<name>' or 'module:factory'"),
    ],
)
def test_bad_jax_env_is_one_line_exit_2_nothing_written(
    capsys, monkeypatch, tmp_path, env_id, message
):
    monkeypatch.setitem(sys.modules, "craftax", None)  # as if not installed
    code, out, err = run_cli(
        capsys,
        "train",
        "cartpole-ppo",
        "--env.backend",
        "jax",
        "--env.id",
        env_id,
        "--log.run-dir",
        str(tmp_path / "runs"),
    )
    assert code == 2 and err.startswith("podrace: error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_missing_gymnax_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "gymnax", None)  # import gymnax raises ImportError
    with pytest.raises(ConfigError, match=r"needs the gymnax package: pip install 'podrace\["):
        env_spec(EnvConfig(id="gymnax:CartPole-v1"))


def test_env_workers_are_refused_for_jax_envs(capsys, tmp_path):
    code, _, err = run_cli(
        capsys,
        "train",
        "cartpole-ppo",
        "--env.id",
        "gymnax:CartPole-v1",
        "--env.workers",
        "2",
        "--log.run-dir",
        str(tmp_path / "runs"),
    )
    assert code == 2 and "env.workers" in err and "jax" in err, err


@pytest.mark.timeout(120)
def test_video_of_a_jax_env_is_refused_in_one_line():
    from podrace.video import check_renderable

    with pytest.raises(ConfigError, match="is written in JAX") as error:
        check_renderable(EnvConfig(id="gymnax:CartPole-v1"), 0)
    assert "\n" not in str(error.value)


def test_craftax_ids_load_craftax_envs_without_autoreset(monkeypatch):
    """Craftax's loader, with a stand-in package (craftax itself is not a test dependency):
    `make_craftax_env_from_name(name, auto_reset=False)` and the env's default params."""
    import types

    from .jax_user_envs import Guess

    asked = []

    def make_craftax_env_from_name(name, auto_reset):
        asked.append((name, auto_reset))
        if name != "Craftax-Classic-Symbolic-v1":
            raise ValueError(f"Unknown craftax environment: {name}")
        return Guess()

    package = types.ModuleType("craftax")
    module = types.ModuleType("craftax.craftax_env")
    module.make_craftax_env_from_name = make_craftax_env_from_name
    package.craftax_env = module
    monkeypatch.setitem(sys.modules, "craftax", package)
    monkeypatch.setitem(sys.modules, "craftax.craftax_env", module)
    spec = env_spec(EnvConfig(id="craftax:Craftax-Classic-Symbolic-v1"))
    assert (spec.obs_shape, spec.num_actions) == ((CLASSES,), CLASSES)
    assert asked == [("Craftax-Classic-Symbolic-v1", False)]
    with pytest.raises(ConfigError, match="Unknown craftax environment: Nope"):
        env_spec(EnvConfig(id="craftax:Nope"))


def test_obs_indices_keep_entries_of_jax_env_observations():
    whole = make_env(EnvConfig(id="gymnax:CartPole-v1"), 4, seed=3)
    kept = make_env(EnvConfig(id="gymnax:CartPole-v1", obs_indices=(2, 0)), 4, seed=3)
    assert kept.spec.obs_shape == (2,)
    assert env_spec(EnvConfig(id="gymnax:CartPole-v1", obs_indices=(2, 0))).obs_shape == (2,)
    np.testing.assert_array_equal(kept.reset(), whole.reset()[:, [2, 0]])
    actions = np.ones(4, np.int32)
    for _ in range(15):
        a, b = kept.step(actions), whole.step(actions)
        np.testing.assert_array_equal(a.obs, b.obs[:, [2, 0]])
    with pytest.raises(ConfigError, match="env.obs_indices must be indices in"):
        env_spec(EnvConfig(id="gymnax:CartPole-v1", obs_indices=(4,)))
