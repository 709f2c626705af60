"""Discrete observations reach the policy one-hot (podrace.envs.spaces.OneHotObs)."""

from __future__ import annotations

import gymnasium
import jax.numpy as jnp
import numpy as np
import pytest

from podrace.config import EnvConfig
from podrace.envs import env_spec
from podrace.envs.spaces import ObservationOutsideSpace, OneHotObs


def test_one_hot_of_indices_from_the_spaces_start():
    encode = OneHotObs(gymnasium.spaces.Discrete(3, start=-1))
    expected = [[1, 0, 0], [0, 0, 1], [0, 1, 0]]
    out = encode(np.array([-1, 1, 0], np.int32))
    assert out.dtype == np.float32 and out.shape == (3, 3)
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(encode.jax(jnp.array([-1, 1, 0], jnp.int32)), expected)
    with pytest.raises(
        ObservationOutsideSpace,
        match=r"in \[-1, 2\) as its Discrete\(3, start=-1\) says, got \[2\]$",
    ):
        encode(np.array([2, 0]))
    with pytest.raises(
        ObservationOutsideSpace, match=r"got \[-7, 2, 5\] and 3 other values$"
    ):  # not 1024 of them
        encode(np.array([5, 6, 0, 7, 8, 2, -7] * 100))
    assert OneHotObs.of(gymnasium.spaces.Box(0, 1, (2,))) is None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["envpool", "gymnasium"])
def test_frozen_lake_states_are_one_hot_vectors(make, backend):
    """Fed as a number, state 7 is "more" than state 6 to the network: PPO on FrozenLake-v1
    ends with eval return 0.0-0.1 after 300k steps on both backends (0.5-0.8 one-hot)."""
    cfg = EnvConfig(id="FrozenLake-v1", backend=backend)
    env = make(cfg, 4, seed=1)
    for spec in (env_spec(cfg), env.spec):
        assert spec.obs_shape == (16,) and spec.obs_dtype == np.float32
    obs = env.reset()
    np.testing.assert_array_equal(
        obs, np.eye(16, dtype=np.float32)[[0, 0, 0, 0]]
    )  # every lake starts top left
    seen = set()
    for _ in range(50):
        obs = env.step(np.full(4, 2)).obs  # right, slipping now and then
        assert obs.dtype == np.float32 and obs.shape == (4, 16)
        np.testing.assert_array_equal(obs.sum(axis=1), 1.0)
        assert set(np.unique(obs)) == {0.0, 1.0}
        seen |= set(obs.argmax(axis=1).tolist())
    assert len(seen) > 2
