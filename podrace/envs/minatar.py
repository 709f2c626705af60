"""MinAtar (Young & Tian 2019) through the `minatar` package's Gymnasium ids.

`MinAtar/<Game>-v1` (minimal action set) and `-v0` (all six actions) are registered with
Gymnasium by `minatar.gym.register_envs`, which only an entry point Gymnasium no longer loads
calls. podrace registers them itself the first time such an id is resolved, in every process
that resolves one (the actor thread's, each env worker's, each Ray worker's), so the id alone
is enough. The package's defaults stand: sticky actions 0.1 and difficulty ramping. Its
observations are 10x10xC boolean planes, which podrace hands on as uint8 0/1 (see
`podrace.envs.spaces.spec_from_spaces`).
"""

from __future__ import annotations

from podrace.config import ConfigError

PREFIX = "MinAtar/"
GAMES = ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")
VERSIONS = ("v0", "v1")


def is_minatar_id(env_id: str) -> bool:
    return env_id.startswith(PREFIX)


def check_minatar_id(env_id: str) -> None:
    """ConfigError (one line) unless `env_id` is `MinAtar/<Game>-v0|v1` with a known game."""
    game, sep, version = env_id[len(PREFIX) :].rpartition("-")
    if not sep or game not in GAMES or version not in VERSIONS:
        raise ConfigError(
            f"unknown MinAtar env id {env_id!r}; MinAtar ids are MinAtar/<Game>-v1 (minimal "
            f"action set) or -v0 (all actions), games: {', '.join(GAMES)}"
        )


def register_minatar(env_id: str) -> None:
    """Make `env_id` (a `MinAtar/...` id) a Gymnasium id in this process; ConfigError (one
    line) for an unknown game or version, or when the `minatar` package is not installed."""
    check_minatar_id(env_id)
    import gymnasium

    if env_id in gymnasium.registry:
        return
    try:
        import minatar.gym
    except ImportError as error:
        raise ConfigError(
            f"env {env_id!r} needs the minatar package ({error}); install it with "
            "pip install 'podrace[minatar]'"
        ) from None
    minatar.gym.register_envs()
    if env_id not in gymnasium.registry:
        raise ConfigError(f"the installed minatar package does not register {env_id!r}")
