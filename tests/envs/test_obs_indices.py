"""`env.obs_indices` keeps some entries of each observation (a partially observed env), on both
backends, in compiled rollouts and for a user's env factory."""

from __future__ import annotations

import gymnasium
import jax
import numpy as np
import pytest

from podrace.config import ConfigError, EnvConfig
from podrace.envs import EnvSource, env_spec
from podrace.envs.spaces import ObsIndices
from podrace.types import EnvSpec

POSITIONS = (0, 2)  # CartPole: cart position, pole angle (velocities 1 and 3 removed)


def test_kept_entries_in_their_order_on_the_host_and_in_jax():
    select = ObsIndices((3, 0), (4,), "Env")
    obs = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(select(obs), [[3, 0], [7, 4]])
    np.testing.assert_array_equal(jax.jit(select.jax)(obs), [[3, 0], [7, 4]])
    spec = EnvSpec((4,), np.float32, 2, ())
    assert select.spec(spec) == EnvSpec((2,), np.float32, 2, ())
    assert ObsIndices.of(None, spec, "Env") is None


@pytest.mark.parametrize(
    "indices,shape,message",
    [
        ((4,), (4,), r"indices in \[0, 4\) of env 'Env'.*got \[4\]"),
        ((-1,), (4,), r"indices in \[0, 4\).*got \[-1\]"),
        ((), (4,), r"got \[\]"),
        ((0,), (4, 84, 84), r"vector observation; env 'Env' has observations of shape"),
    ],
)
def test_indices_that_cannot_be_kept_are_a_config_error(indices, shape, message):
    with pytest.raises(ConfigError, match=message):
        ObsIndices(indices, shape, "Env")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["envpool", "gymnasium"])
def test_cartpole_positions_only_on_both_backends(make, backend):
    whole = make(EnvConfig(id="CartPole-v1", backend=backend), 4, seed=3)
    cfg = EnvConfig(id="CartPole-v1", backend=backend, obs_indices=POSITIONS)
    kept = make(cfg, 4, seed=3)
    for spec in (env_spec(cfg), kept.spec):
        assert spec.obs_shape == (2,) and spec.obs_dtype == np.float32
    np.testing.assert_array_equal(kept.reset(), whole.reset()[:, POSITIONS])
    actions = np.random.default_rng(0).integers(0, 2, (60, 4))
    ends = 0
    for a in actions:  # through episode ends and autoresets
        full, part = whole.step(a), kept.step(a)
        assert part.obs.shape == (4, 2)
        np.testing.assert_array_equal(part.obs, full.obs[:, POSITIONS])
        np.testing.assert_array_equal(part.terminated, full.terminated)
        ends += int(full.terminated.sum())
    assert ends > 0


@pytest.mark.timeout(60)
def test_compiled_envpool_steps_keep_the_same_entries(make):
    cfg = EnvConfig(id="CartPole-v1", backend="envpool", obs_indices=POSITIONS)
    host, fused = make(cfg, 3, seed=5), make(cfg, 3, seed=5)
    host.reset()
    fused.reset()
    step = fused.xla_step()
    actions = np.random.default_rng(1).integers(0, 2, (20, 3)).astype(np.int32)

    @jax.jit
    def roll(handle, actions):
        def body(handle, action):
            handle, out = step(handle, action)
            return handle, out.obs

        return jax.lax.scan(body, handle, actions)[1]

    compiled = jax.device_get(roll(step.handle, actions))
    for t, a in enumerate(actions):
        np.testing.assert_array_equal(compiled[t], host.step(a).obs)


@pytest.mark.timeout(60)
def test_a_factorys_envs_keep_the_same_entries():
    def factory(num_envs, seed):
        return gymnasium.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync")

    source = EnvSource(EnvConfig(obs_indices=(1,)), factory)
    assert source.spec().obs_shape == (1,)
    env = source.make(2, 0)
    try:
        assert env.reset().shape == (2, 1)
        assert env.step(np.zeros(2, np.int64)).obs.shape == (2, 1)
    finally:
        env.close()
    with pytest.raises(ConfigError, match=r"indices in \[0, 4\)"):
        EnvSource(EnvConfig(obs_indices=(9,)), factory).spec()
