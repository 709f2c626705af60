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


def _procgen_loads() -> bool:
    try:
        import envpool

        envpool.make_spec("CoinrunEasy-v0")
    except ImportError:
        return False
    return True


QT_MISSING = "libQt5Gui.so.5: cannot open shared object file: No such file or directory"
QT_HINT = "EnvPool Procgen requires the system Qt 5 runtime on Linux."


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["simulated", "this machine"])
def test_an_envpool_env_whose_system_library_is_missing_is_one_line_exit_2(
    capsys, tmp_path, monkeypatch, how
):
    """Procgen without Qt 5: envpool's ImportError reached the user as a 58-line traceback,
    exit 1. The line names the env, the library the loader did not find and envpool's hint."""
    import envpool

    from podrace.cli import main

    if how == "simulated":

        def make_spec(env_id, **kwargs):
            try:
                raise ImportError(QT_MISSING)
            except ImportError as missing:
                raise ImportError(f"{QT_HINT} Install the Qt5 Core/Gui shared libraries.") from (
                    missing
                )

        monkeypatch.setattr(envpool, "make_spec", make_spec)
    elif _procgen_loads():
        pytest.skip("envpool's Procgen loads here (Qt 5 is installed)")
    code = main(
        ["train", "cartpole-ppo", "--env.id", "CoinrunEasy-v0", "--log.run-dir", str(tmp_path)]
    )
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(
        "podrace: error: env 'CoinrunEasy-v0' cannot be made, a library it needs is missing: "
        f"{QT_MISSING} ({QT_HINT}"
    ), err
    assert not list(tmp_path.iterdir())
