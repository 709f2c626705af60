"""resolve_backend: registry lookups only, one-line ConfigErrors."""

import gymnasium
import pytest

from podrace.config import ConfigError, EnvConfig
from podrace.envs import resolve_backend

from .toy_envs import COUNTER_ID


def _error(cfg: EnvConfig) -> str:
    with pytest.raises(ConfigError) as info:
        resolve_backend(cfg)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_auto_prefers_envpool_then_gymnasium():
    assert resolve_backend(EnvConfig(id="CartPole-v1")) == "envpool"
    assert resolve_backend(EnvConfig(id="Breakout-v5")) == "envpool"
    assert resolve_backend(EnvConfig(id=COUNTER_ID)) == "gymnasium"
    assert resolve_backend(EnvConfig(id="CartPole-v1", backend="gymnasium")) == "gymnasium"


def test_unknown_id():
    message = _error(EnvConfig(id="Foo-v0"))
    assert message == "unknown env id 'Foo-v0' (not an envpool or Gymnasium id)"


def test_id_missing_from_requested_backend():
    assert "not an envpool id" in _error(EnvConfig(id=COUNTER_ID, backend="envpool"))
    assert "Gymnasium" in _error(EnvConfig(id="Breakout-v5", backend="gymnasium"))
    assert "env.backend" in _error(EnvConfig(id="CartPole-v1", backend="ray"))


def test_builds_no_env(monkeypatch):
    import envpool

    def forbidden(*args, **kwargs):
        raise AssertionError("resolve_backend must not build an env")

    for module, name in [(envpool, "make"), (envpool, "make_spec"), (gymnasium, "make")]:
        monkeypatch.setattr(module, name, forbidden)
    monkeypatch.setattr(gymnasium, "make_vec", forbidden)
    for env_id in ("CartPole-v1", COUNTER_ID, "Pendulum-v1"):
        resolve_backend(EnvConfig(id=env_id))
    _error(EnvConfig(id="Foo-v0"))
