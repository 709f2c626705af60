"""What step() returns is safe to keep, and what it accepts is checked."""

import numpy as np
import pytest

from podrace.config import EnvConfig


@pytest.mark.parametrize(
    "env_id,backend",
    [("CartPole-v1", "envpool"), ("CartPole-v1", "gymnasium"), ("Pong-v5", "envpool")],
)
def test_results_are_not_overwritten_by_later_steps(make, env_id, backend):
    """The actor keeps T steps of obs; a backend reusing its buffers would corrupt them."""
    env = make(EnvConfig(id=env_id, backend=backend), 2, seed=0)
    env.reset()
    kept, copies = [], []
    for t in range(200):
        step = env.step(np.full(2, t % 2, np.int32))
        kept.append(step)
        copies.append([np.array(x, copy=True) for x in step])
    for step, copy in zip(kept, copies):
        for x, y in zip(step, copy):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("backend", ["envpool", "gymnasium"])
def test_actions_are_checked(make, backend):
    env = make(EnvConfig(id="CartPole-v1", backend=backend), 2)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(2, np.int32))
    env.reset()
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros(3, np.int32))
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        env.step(np.array([0, 2], np.int32))
    with pytest.raises(ValueError, match="integers"):
        env.step(np.zeros(2, np.float32))
    env.step(np.array([0, 1], np.int32))
    env.close()
    env.close()  # idempotent
