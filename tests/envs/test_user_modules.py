"""Custom env ids: 'module:EnvId' on the CLI, and invalid envs stopped with one line, exit 2."""

from __future__ import annotations

import json
import sys

import gymnasium
import numpy as np
import pytest

from podrace.config import ConfigError, EnvConfig
from podrace.envs import env_spec, resolve_backend
from podrace.envs.user_modules import split_env_id
from tests.helpers.cli import run_cli

from .user_envs import MATCH_LENGTH, RANDOM_RETURN

USER_MODULE = """
import gymnasium
from tests.envs.user_envs import MatchEnv
gymnasium.register("{env_id}", entry_point=MatchEnv)
"""


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A working directory holding a user's module, not importable until podrace makes it so."""
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cli_trains_env_from_user_module_beyond_random(capsys, user_dir):
    (user_dir / "my_match_envs.py").write_text(USER_MODULE.format(env_id="cli-user/Match-v0"))
    code, out, err = run_cli(
        capsys,
        "train",
        "cartpole-ppo",
        "--env.id",
        "my_match_envs:cli-user/Match-v0",
        "--total-steps",
        "8192",
        "--log.run-dir",
        "runs",
        "--log.run-name",
        "r",
        "--log.console",
        "none",
        "--eval.episodes",
        "16",
    )
    assert code == 0, err
    lines = [
        json.loads(line)
        for line in (user_dir / "runs" / "r" / "metrics.jsonl").read_text().splitlines()
    ]
    final_eval = [line["eval/return"] for line in lines if "eval/return" in line][-1]
    # A random policy scores RANDOM_RETURN (2 of 8); the greedy learned policy names most classes.
    assert final_eval >= 0.75 * MATCH_LENGTH > 2 * RANDOM_RETURN, out
    assert (
        json.loads((user_dir / "runs" / "r" / "config.json").read_text())["env"]["id"]
        == "my_match_envs:cli-user/Match-v0"
    )


@pytest.mark.timeout(60)
def test_module_form_in_config_imports_before_resolving(user_dir):
    (user_dir / "my_other_envs.py").write_text(USER_MODULE.format(env_id="cfg-user/Match-v0"))
    sys.path.insert(0, str(user_dir))  # a library user's own script directory
    cfg = EnvConfig(id="my_other_envs:cfg-user/Match-v0")
    assert resolve_backend(cfg) == "gymnasium"
    spec = env_spec(cfg)
    assert spec.num_actions == 4 and spec.obs_shape == (4,)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "env_id,message",
    [
        ("no_such_module_xyz:Foo-v0", "cannot import module 'no_such_module_xyz'"),
        ("gymnasium:NoSuchEnv-v0", "unknown env id 'gymnasium:NoSuchEnv-v0'"),
        (":Foo-v0", "must be 'module:EnvId'"),
        ("mod:", "must be 'module:EnvId'"),
    ],
)
def test_bad_module_ids_are_one_line_exit_2_nothing_written(capsys, user_dir, env_id, message):
    code, out, err = run_cli(
        capsys, "train", "cartpole-ppo", "--env.id", env_id, "--log.run-dir", "runs"
    )
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (user_dir / "runs").exists()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "body,error",
    [
        (
            "raise RuntimeError('no licence key\\nin ~/.env')",
            "RuntimeError: no licence key in ~/.env",
        ),
        ("1 / 0", "ZeroDivisionError: division by zero"),
        ("import sys\nsys.exit(3)", "SystemExit: 3"),
        ("def broken(:\n    pass", "SyntaxError: invalid syntax"),
    ],
    ids=["runtime-error", "zero-division", "sys-exit", "syntax-error"],
)
def test_a_module_that_raises_on_import_is_one_line_naming_it_exit_2(capsys, user_dir, body, error):
    """Only ImportError was a config error; any other exception in the user's module was a
    traceback of podrace's frames and exit 1 (SystemExit ended podrace with its code)."""
    (user_dir / "raising_envs.py").write_text(f"{body}\n")
    code, out, err = run_cli(
        capsys,
        "train",
        "cartpole-ppo",
        "--env.id",
        "raising_envs:Match-v0",
        "--log.run-dir",
        "runs",
    )
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(
        "podrace: error: env.id 'raising_envs:Match-v0': importing module 'raising_envs' "
        f"failed ({user_dir / 'raising_envs.py'}, line "
    ), err
    assert f"): {error}" in err, err
    assert not (user_dir / "runs").exists()
    sys.modules.pop("raising_envs", None)


def test_split_env_id():
    assert split_env_id("CartPole-v1") == (None, "CartPole-v1")
    assert split_env_id("pkg.mod:ns/Env-v0") == ("pkg.mod", "ns/Env-v0")


# --- envs that cannot run ------------------------------------------------------------------


class _NeedsMujoco(gymnasium.Env):
    def __init__(self):
        raise gymnasium.error.DependencyNotInstalled(
            'mujoco is not installed, run `pip install "gymnasium[mujoco]"`'
        )


class _IntBoxActions(gymnasium.Env):
    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gymnasium.spaces.Box(-5, 5, (2,), np.int64)


class _DictObs(gymnasium.Env):
    observation_space = gymnasium.spaces.Dict({"a": gymnasium.spaces.Discrete(2)})
    action_space = gymnasium.spaces.Discrete(2)


class _MultiDiscreteActions(gymnasium.Env):
    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gymnasium.spaces.MultiDiscrete([2, 3])


INVALID = {
    "podrace-invalid/NeedsMujoco-v0": (
        _NeedsMujoco,
        "a package it needs is missing: mujoco is not installed",
    ),
    # An entry point in a module that does not exist: ModuleNotFoundError on make.
    "podrace-invalid/MissingModule-v0": (
        "no_such_physics_engine.envs:Walker",
        "No module named 'no_such_physics_engine'",
    ),
    "podrace-invalid/IntBox-v0": (
        _IntBoxActions,
        "Box action space with integer dtype int64 is not supported",
    ),
    "podrace-invalid/DictObs-v0": (_DictObs, "unsupported observation space Dict"),
    "podrace-invalid/MultiDiscrete-v0": (
        _MultiDiscreteActions,
        "unsupported action space MultiDiscrete",
    ),
}
for _id, (_entry, _) in INVALID.items():
    if _id not in gymnasium.registry:
        gymnasium.register(_id, entry_point=_entry)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("env_id", sorted(INVALID))
def test_invalid_env_is_one_line_exit_2_nothing_written(capsys, tmp_path, env_id):
    code, out, err = run_cli(
        capsys, "train", "cartpole-ppo", "--env.id", env_id, "--log.run-dir", str(tmp_path)
    )
    assert code == 2, err
    assert err.startswith("podrace: error: ") and INVALID[env_id][1] in err, err
    assert len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("env_id", ["podrace-invalid/IntBox-v0", "podrace-invalid/DictObs-v0"])
def test_unsupported_space_error_lists_what_is_supported(env_id):
    with pytest.raises(
        ConfigError, match="supported: Box or Discrete observations; Discrete actions"
    ):
        env_spec(EnvConfig(id=env_id))
