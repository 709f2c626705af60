"""Fixtures for the env tests."""

from __future__ import annotations

import pytest

from podrace.config import EnvConfig
from podrace.envs import BatchedEnv, make_env

from . import toy_envs  # noqa: F401  (registers the toy env ids)


@pytest.fixture
def make():
    """`make_env` that closes every env it made when the test ends."""
    envs: list[BatchedEnv] = []

    def _make(cfg: EnvConfig, num_envs: int, seed: int = 0) -> BatchedEnv:
        envs.append(make_env(cfg, num_envs, seed))
        return envs[-1]

    yield _make
    for env in envs:
        env.close()
