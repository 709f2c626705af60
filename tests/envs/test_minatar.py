"""MinAtar through the `minatar` package: its ids registered by podrace wherever envs are
made, boolean planes as uint8 0/1, and a missing package or an unknown game stopped with one
line, exit 2."""

from __future__ import annotations

import sys

import gymnasium
import numpy as np
import pytest

from podrace.cli import main
from podrace.config import ConfigError, EnvConfig
from podrace.envs import EnvSource, env_spec, resolve_backend
from podrace.envs.minatar import GAMES
from tests.envs.worker_steps import assert_workers_step_as_one

pytest.importorskip("minatar")
pytestmark = pytest.mark.timeout(120)

# (game, channels, minimal actions): the package's v1 ids.
SHAPES = {
    "Asterix": (4, 5),
    "Breakout": (4, 3),
    "Freeway": (7, 3),
    "Seaquest": (10, 6),
    "SpaceInvaders": (6, 4),
}


@pytest.fixture
def unregistered(monkeypatch):
    """A Gymnasium registry without the MinAtar ids, as in a fresh process (nothing in
    Gymnasium registers them: the package's entry point is not loaded)."""
    for env_id in [k for k in gymnasium.registry if k.startswith("MinAtar/")]:
        monkeypatch.delitem(gymnasium.registry, env_id)


def test_a_minatar_id_is_registered_when_it_is_resolved(unregistered):
    assert "MinAtar/Breakout-v1" not in gymnasium.registry
    assert resolve_backend(EnvConfig(id="MinAtar/Breakout-v1")) == "gymnasium"
    assert "MinAtar/Breakout-v1" in gymnasium.registry


@pytest.mark.parametrize("game", GAMES)
def test_every_game_gives_uint8_planes_of_its_shape(unregistered, make, game):
    channels, actions = SHAPES[game]
    cfg = EnvConfig(id=f"MinAtar/{game}-v1")
    spec = env_spec(cfg)
    assert spec.obs_shape == (10, 10, channels) and spec.obs_dtype == np.uint8
    assert spec.num_actions == actions
    env = make(cfg, 3)
    obs = env.reset()
    assert obs.dtype == np.uint8 and obs.shape == (3, 10, 10, channels)
    rng = np.random.default_rng(0)
    for _ in range(30):
        step = env.step(rng.integers(0, actions, 3).astype(np.int64))
        assert step.obs.dtype == np.uint8 and step.obs.shape == (3, 10, 10, channels)
        assert set(np.unique(step.obs)) <= {0, 1}
    assert step.obs.any()  # the planes hold the game's objects, not zeros


@pytest.mark.timeout(300)
def test_env_workers_register_the_ids_in_their_own_processes():
    """Each env worker is a fresh interpreter: it must register the id itself."""
    source = EnvSource(EnvConfig(id="MinAtar/SpaceInvaders-v1"))
    spec = source.spec()

    def planes_stay_uint8(step) -> None:
        assert step.obs.dtype == np.uint8

    assert_workers_step_as_one(
        source, spec, 4, 5, workers=2, steps=40, action_dtype=np.int64, check=planes_stay_uint8
    )


@pytest.mark.parametrize(
    "env_id", ["MinAtar/Pong-v1", "MinAtar/Breakout-v2", "MinAtar/Breakout", "MinAtar/"]
)
def test_an_unknown_minatar_id_names_the_games(env_id):
    with pytest.raises(ConfigError, match="games: Asterix, Breakout, Freeway, Seaquest"):
        resolve_backend(EnvConfig(id=env_id))


def test_a_missing_package_is_a_config_error_naming_the_extra(unregistered, monkeypatch):
    monkeypatch.setitem(sys.modules, "minatar", None)  # import minatar raises ImportError
    monkeypatch.setitem(sys.modules, "minatar.gym", None)
    with pytest.raises(ConfigError, match=r"needs the minatar package .*podrace\[minatar\]"):
        resolve_backend(EnvConfig(id="MinAtar/Breakout-v1"))


@pytest.mark.parametrize(
    "env_id,missing,message",
    [
        ("MinAtar/Pong-v1", False, "podrace: error: unknown MinAtar env id 'MinAtar/Pong-v1'"),
        ("MinAtar/Breakout-v1", True, "podrace: error: env 'MinAtar/Breakout-v1' needs the "),
    ],
    ids=["unknown-game", "missing-package"],
)
def test_the_cli_stops_with_one_line_and_exit_2_before_anything_starts(
    unregistered, monkeypatch, capsys, tmp_path, env_id, missing, message
):
    if missing:
        monkeypatch.setitem(sys.modules, "minatar", None)
        monkeypatch.setitem(sys.modules, "minatar.gym", None)
    code = main(
        ["train", "minatar-ppo", "--env.id", env_id, "--log.run-dir", str(tmp_path / "runs")]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(message) and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()
