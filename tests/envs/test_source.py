"""Env factories adapted to the BatchedEnv contract, and EnvSource (id or factory)."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest

from podrace.config import ConfigError, EnvConfig
from podrace.envs import BatchedEnv, EnvSource, from_factory, make_env

from .contract import run_checked
from .toy_envs import COUNTER_TERMINAL_SUM, COUNTER_TIME_LIMIT, CounterEnv
from .user_envs import MatchEnv


def counter_vector_env(num_envs: int, seed: int, **vector_kwargs) -> gymnasium.vector.VectorEnv:
    """What a user's factory typically returns: a SyncVectorEnv of wrapped envs."""
    del seed  # the adapter seeds the first reset
    make_one = lambda: gymnasium.wrappers.TimeLimit(CounterEnv(), COUNTER_TIME_LIMIT)  # noqa: E731
    return gymnasium.vector.SyncVectorEnv([make_one] * num_envs, **vector_kwargs)


def match_vector_env(num_envs: int, seed: int) -> gymnasium.vector.VectorEnv:
    return gymnasium.vector.SyncVectorEnv([MatchEnv] * num_envs, copy=False)


@pytest.fixture
def adapted():
    envs: list[BatchedEnv] = []

    def _make(factory, num_envs: int, seed: int = 0) -> BatchedEnv:
        envs.append(from_factory(factory, num_envs, seed))
        return envs[-1]

    yield _make
    for env in envs:
        env.close()


@pytest.mark.timeout(60)
def test_vector_env_factory_meets_the_autoreset_contract(adapted):
    """Same episodes as the registered toy env through the Gymnasium backend: all-ones
    episodes terminate after 3 steps, all-zeros ones are truncated, autoreset steps ignore
    their action and episode statistics are counted by the adapter (no wrapper needed)."""
    env = adapted(counter_vector_env, 2)
    assert isinstance(env, BatchedEnv) and env.num_envs == 2 and env.spec.num_actions == 2
    rec = run_checked(env, lambda obs, t: np.array([1, 0], np.int32), 13)
    ends0 = [t for t, s in enumerate(rec.steps) if s.terminated[0] or s.truncated[0]]
    ends1 = [t for t, s in enumerate(rec.steps) if s.terminated[1] or s.truncated[1]]
    assert ends0 == [2, 6, 10] and all(rec.steps[t].terminated[0] for t in ends0)
    assert ends1 == [4, 10] and all(rec.steps[t].truncated[1] for t in ends1)
    assert sorted(rec.episodes) == sorted(
        [(0, 3.0 * COUNTER_TERMINAL_SUM, COUNTER_TERMINAL_SUM)] * 3
        + [(1, 1.0 * COUNTER_TIME_LIMIT, COUNTER_TIME_LIMIT)] * 2
    )
    assert all((o == 0).all() for o in rec.reset_obs)


@pytest.mark.timeout(60)
def test_factory_env_matches_the_registered_env_step_for_step(adapted, make):
    """A factory of MatchEnv and the same env by id, same seed: identical streams."""
    import tests.envs.user_envs as user_envs

    by_id = make(EnvConfig(id=user_envs.MATCH_ID, backend="gymnasium"), 3, seed=7)
    by_factory = adapted(match_vector_env, 3, seed=7)
    np.testing.assert_array_equal(by_id.reset(), by_factory.reset())
    for t in range(20):
        a, b = by_id.step(np.full(3, t % 4, np.int32)), by_factory.step(np.full(3, t % 4, np.int32))
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


@pytest.mark.timeout(60)
def test_seeds_make_runs_reproducible_and_distinct(adapted):
    def first_obs(seed):
        env = adapted(match_vector_env, 4, seed=seed)
        return np.concatenate(
            [env.reset()] + [env.step(np.zeros(4, np.int32)).obs for _ in range(10)]
        )

    np.testing.assert_array_equal(first_obs(3), first_obs(3))
    assert not np.array_equal(first_obs(3), first_obs(4))


@pytest.mark.timeout(60)
def test_results_survive_a_vector_env_that_reuses_its_buffer(adapted):
    env = adapted(match_vector_env, 2)  # copy=False: the vector env writes obs in place
    kept = [env.reset()] + [env.step(np.zeros(2, np.int32)).obs for _ in range(30)]
    copies = [k.copy() for k in kept]
    for k, c in zip(kept, copies):
        np.testing.assert_array_equal(k, c)
    assert len({c.tobytes() for c in copies}) > 1


@pytest.mark.timeout(60)
def test_batched_env_factory_is_used_as_is(adapted):
    made = []

    def factory(num_envs, seed):
        made.append(make_env(EnvConfig(id="CartPole-v1"), num_envs, seed))
        return made[-1]

    assert adapted(factory, 3, seed=2) is made[0]


class _Closing(gymnasium.vector.SyncVectorEnv):
    closed = 0

    def close_extras(self, **kwargs):
        type(self).closed += 1
        super().close_extras(**kwargs)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "factory,message",
    [
        (
            lambda n, s: counter_vector_env(
                n, s, autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP
            ),
            "autoreset_mode is AutoresetMode.SAME_STEP; "
            "podrace needs gymnasium.vector.AutoresetMode.NEXT_STEP",
        ),
        (lambda n, s: counter_vector_env(n + 1, s), "was asked for 2 envs and made 3"),
        (
            lambda n, s: CounterEnv(),
            "returned CounterEnv; expected a podrace BatchedEnv or a gymnasium.vector.VectorEnv "
            "(wrap it",
        ),
        (lambda n, s: None, "returned NoneType"),
        (
            lambda n, s: gymnasium.vector.SyncVectorEnv(
                [lambda: gymnasium.make("podrace-invalid/MultiDiscrete-v0")] * n
            ),
            "unsupported action space MultiDiscrete",
        ),
    ],
)
def test_unusable_factory_results_are_one_line_config_errors(factory, message):
    from . import test_user_modules  # noqa: F401  (registers the invalid envs)

    with pytest.raises(ConfigError) as info:
        from_factory(factory, 2, 0)
    assert message in str(info.value) and "\n" not in str(info.value)


class _FailsToClose(gymnasium.vector.SyncVectorEnv):
    def close_extras(self, **kwargs):
        raise RuntimeError("close fails")


@pytest.mark.timeout(60)
def test_rejected_vector_env_is_closed_and_a_failing_close_does_not_hide_why(caplog):
    _Closing.closed = 0
    factory = lambda n, s: _Closing([CounterEnv] * (n + 1))  # noqa: E731
    with pytest.raises(ConfigError):
        from_factory(factory, 2, 0)
    assert _Closing.closed == 1
    with pytest.raises(ConfigError, match="was asked for 2 envs and made 3"):
        from_factory(lambda n, s: _FailsToClose([CounterEnv] * (n + 1)), 2, 0)
    assert "env.close() raised RuntimeError: close fails" in caplog.text


@pytest.mark.timeout(60)
def test_factory_with_missing_dependency_is_a_config_error():
    def needs_mujoco(num_envs, seed):
        import no_such_mujoco_binding  # noqa: F401

    with pytest.raises(
        ConfigError, match="needs_mujoco.*a package it needs is missing: No module named"
    ):
        from_factory(needs_mujoco, 2, 0)


@pytest.mark.timeout(60)
def test_env_source_validates_and_builds_from_id_or_factory():
    by_id = EnvSource(EnvConfig(id="CartPole-v1", num_envs=2))
    assert by_id.spec().num_actions == 2
    calls = []

    def factory(num_envs, seed):
        calls.append((num_envs, seed))
        return match_vector_env(num_envs, seed)

    source = EnvSource(EnvConfig(id="ignored", num_envs=4), factory)
    assert source.spec().num_actions == 4 and calls == [(4, 0)]
    env = source.make(2, 9)
    try:
        assert env.num_envs == 2 and calls[-1] == (2, 9)
    finally:
        env.close()
    with pytest.raises(ConfigError, match="must be callable"):
        EnvSource(EnvConfig(), "CartPole-v1").spec()
    with pytest.raises(ConfigError, match="unknown env id"):
        EnvSource(EnvConfig(id="NoSuchEnv-v0")).spec()


class CloseRaises(CounterEnv):
    def close(self):
        raise RuntimeError("user close() failed")


@pytest.mark.timeout(60)
def test_a_spec_probe_whose_close_raises_is_a_warning_not_a_failure(caplog):
    """The probe env's close() raising is logged as a warning: `podrace train` goes on, with
    no traceback before anything started."""
    gymnasium.register(
        "PodraceCloseRaises-v0", entry_point=CloseRaises, max_episode_steps=COUNTER_TIME_LIMIT
    )
    try:
        spec = EnvSource(EnvConfig(id="PodraceCloseRaises-v0", num_envs=2)).spec()
        assert spec.num_actions == CounterEnv.action_space.n
        factory = lambda n, seed: gymnasium.vector.SyncVectorEnv([CloseRaises] * n)  # noqa: E731
        assert EnvSource(EnvConfig(num_envs=2), factory).spec() == spec
    finally:
        gymnasium.envs.registration.registry.pop("PodraceCloseRaises-v0", None)
    assert caplog.text.count("env.close() raised RuntimeError: user close() failed") == 2


class _Factories:
    @staticmethod
    def nested(num_envs: int, seed: int):
        return match_vector_env(num_envs, seed)


@pytest.mark.timeout(60)
def test_a_run_records_the_factory_by_a_name_another_process_imports_back(tmp_path, monkeypatch):
    """Only what imports back to the factory itself is recorded as importable: a resume or
    an eval must build the run's envs, not something of the same name."""
    import functools

    from podrace.envs.source import (
        FactoryNotImportable,
        factory_record,
        factory_reference,
        import_factory,
        stored_env_source,
    )

    def local(num_envs, seed):
        return match_vector_env(num_envs, seed)

    here = __name__
    assert factory_reference(match_vector_env) == f"{here}:match_vector_env"
    assert factory_reference(_Factories.nested) == f"{here}:_Factories.nested"
    assert factory_reference(MatchEnv) == "tests.envs.user_envs:MatchEnv"
    for unimportable in (local, lambda n, s: None, functools.partial(match_vector_env)):
        assert factory_reference(unimportable) is None, unimportable
    main_factory = type(local)(local.__code__, {"__name__": "__main__"}, "main_envs")
    main_factory.__module__ = "__main__"
    assert factory_reference(main_factory) is None
    assert factory_record(local) == {"name": local.__qualname__, "import": None}
    assert import_factory(f"{here}:_Factories.nested") is _Factories.nested

    cfg = EnvConfig(id="CartPole-v1")
    assert stored_env_source(cfg, None) == EnvSource(cfg)
    assert stored_env_source(cfg, factory_record(local), EnvSource(cfg, local)).factory is local
    source = stored_env_source(cfg, factory_record(match_vector_env))
    assert source.factory is match_vector_env
    with pytest.raises(FactoryNotImportable, match=r"cannot import \(only a function or class"):
        stored_env_source(cfg, factory_record(local))

    (tmp_path / "broken_factories.py").write_text("raise RuntimeError('no GPU here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        FactoryNotImportable,
        match=r"^its envs came from the env factory 'broken_factories:make', whose module "
        r"'broken_factories' cannot be imported \(.*broken_factories.py, line 1\): "
        r"RuntimeError: no GPU here$",
    ):
        import_factory("broken_factories:make")
    with pytest.raises(FactoryNotImportable, match=f"module '{here}' no longer defines"):
        import_factory(f"{here}:gone")
