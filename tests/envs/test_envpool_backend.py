"""envpool's XLA step as podrace declares it: effect-free, so compiled rollouts keep JAX's C++
dispatch."""

import types

import jax
import numpy as np
import pytest
from envpool.python import xla_template

from podrace.config import EnvConfig
from podrace.envs.envpool_backend import EnvpoolEnv, effect_free_xla


@pytest.mark.timeout(60)
def test_the_xla_step_has_no_effect_and_envpools_template_is_left_as_it_was():
    env = EnvpoolEnv(EnvConfig(id="CartPole-v1"), 4, seed=0)
    env.reset()
    xla = env.xla_step()
    actions = np.zeros(4, np.int32)
    jaxpr = jax.make_jaxpr(xla)(xla.handle, actions)
    assert jaxpr.effects == set()  # an effect sends every call of the rollout through Python
    assert xla_template.ffi is jax.ffi

    @jax.jit
    def two_steps(handle, actions):
        handle, first = xla(handle, actions)
        handle, second = xla(handle, actions)
        return handle, first.obs, second.obs

    _, first, second = two_steps(xla.handle, actions)
    assert not np.array_equal(first, second)  # both steps ran, in order (the poles moved on)
    env.close()


@pytest.mark.timeout(60)
def test_a_changed_envpool_template_keeps_envpools_own_calls(monkeypatch):
    changed = types.SimpleNamespace(
        register_ffi_target=jax.ffi.register_ffi_target, ffi_call=jax.ffi.ffi_call
    )
    monkeypatch.setattr(xla_template, "ffi", changed)
    env = EnvpoolEnv(EnvConfig(id="CartPole-v1"), 2, seed=0)
    env.reset()
    handle, _, _, step = effect_free_xla(env._env)
    assert jax.make_jaxpr(step)(handle, np.zeros(2, np.int32)).effects  # envpool's, as they are
    assert xla_template.ffi is changed
    env.close()
