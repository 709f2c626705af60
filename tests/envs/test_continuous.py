"""Continuous actions: spec bounds, clipping inside the adapter, caller's array untouched."""

import numpy as np
import pytest

from podrace.config import EnvConfig
from podrace.envs import env_spec
from podrace.envs.spaces import ActionPreparer

from .toy_envs import ECHO_ID


@pytest.mark.parametrize("backend", ["envpool", "gymnasium"])
def test_pendulum_spec(make, backend):
    cfg = EnvConfig(id="Pendulum-v1", backend=backend)
    for spec in (env_spec(cfg), make(cfg, 2).spec):
        assert not spec.discrete and spec.num_actions is None
        assert spec.action_shape == (1,)
        np.testing.assert_array_equal(spec.action_low, [-2.0])
        np.testing.assert_array_equal(spec.action_high, [2.0])
        assert spec.obs_shape == (3,) and spec.obs_dtype == np.float32


@pytest.mark.parametrize("backend", ["envpool", "gymnasium"])
def test_pendulum_out_of_range_action_acts_as_bound(make, backend):
    """Stepping with +-50 must match stepping with the bounds +-2, step for step."""
    cfg = EnvConfig(id="Pendulum-v1", backend=backend)
    wild, bounded = make(cfg, 2, seed=5), make(cfg, 2, seed=5)
    np.testing.assert_array_equal(wild.reset(), bounded.reset())
    action = np.array([[50.0], [-50.0]], np.float32)
    for _ in range(10):
        a, b = wild.step(action), bounded.step(np.clip(action, -2, 2))
        np.testing.assert_array_equal(a.obs, b.obs)
        np.testing.assert_array_equal(a.reward, b.reward)
    np.testing.assert_array_equal(action, [[50.0], [-50.0]])


def test_gymnasium_env_receives_clipped_action(make):
    env = make(EnvConfig(id=ECHO_ID, backend="gymnasium"), 2)
    env.reset()
    action = np.array([[3.0, -0.5], [-7.0, 0.25]], np.float32)
    step = env.step(action)
    np.testing.assert_array_equal(step.obs, [[1.0, -0.5], [-1.0, 0.25]])
    np.testing.assert_array_equal(action, [[3.0, -0.5], [-7.0, 0.25]])  # sample kept unclipped


def test_action_preparer():
    spec = env_spec(EnvConfig(id=ECHO_ID, backend="gymnasium"))
    prepare = ActionPreparer(spec, 2, np.float32)
    sample = np.array([[2.0, 0.5], [-2.0, -0.5]], np.float64)
    out = prepare(sample)
    assert out.dtype == np.float32 and not np.shares_memory(out, sample)
    np.testing.assert_array_equal(out, [[1.0, 0.5], [-1.0, -0.5]])
    with pytest.raises(ValueError, match="shape"):
        prepare(np.zeros((3, 2)))
