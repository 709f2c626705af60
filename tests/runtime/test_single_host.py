"""End-to-end checks of the single-host thread runtime (small CartPole runs)."""

import dataclasses
import time

import jax
import numpy as np
import pytest

from podrace.config import ConfigError, replace
from podrace.control import ComponentError
from podrace.presets import PRESETS
from podrace.runtime.run import prepare, train
from tests.helpers.configs import LEARNS, small
from tests.helpers.runs import record_batches
from tests.threads import podrace_threads


def record_versions(run) -> list[tuple[int, list[int]]]:
    """(learner version, behaviour versions) of every batch the run's learner takes."""
    return record_batches(run, lambda version, batch: (version, [r.policy_version for r in batch]))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_short_run_writes_config_and_metrics(tmp_path):
    run = prepare(small(tmp_path))
    # A line written before the first rollout arrives names the env steps too (0).
    assert run.metrics.collect()["env_steps"] == 0
    result = run.run()
    assert result.updates == 12
    assert result.env_steps == 12 * 2 * 8 * 16
    assert (result.run_dir / "config.json").exists()
    lines = (result.run_dir / "metrics.jsonl").read_text().splitlines()
    assert lines and '"final": 1' in lines[-1]
    assert result.final_eval is not None and result.final_eval.version == 12
    assert not podrace_threads()


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("lag,synchronous", [(1, False), (2, False), (0, True)])
def test_lag_bound_holds_for_every_consumed_rollout(tmp_path, lag, synchronous):
    cfg = small(
        tmp_path,
        **{"layout.max_policy_lag": lag, "layout.synchronous": synchronous, "layout.queue_size": 3},
    )
    run = prepare(cfg)
    seen = record_versions(run)
    run.run()
    bound = 0 if synchronous else lag
    lags = [version - v for version, versions in seen for v in versions]
    assert len(seen) == cfg.num_updates
    assert max(lags) <= bound
    assert min(lags) >= 0
    if synchronous:
        assert set(lags) == {0}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_loops_run_under_transfer_guard(tmp_path):
    """Threads run with transfer_guard('disallow'): an implicit transfer fails the run."""
    run = prepare(small(tmp_path))
    actor = run.actors[1]
    step = actor.policy.step

    def implicit_step(params, obs, key):
        # A host array handed to a jitted function is an implicit host-to-device transfer.
        return step(params, jax.device_get(obs), key)

    actor.policy = dataclasses.replace(actor.policy, step=implicit_step)
    with pytest.raises(ComponentError, match="actor-1 failed.*[Dd]isallowed host-to-device"):
        run.run()


class RaisingEnv:
    def __init__(self, env, at_step):
        self.env, self.at_step, self.steps = env, at_step, 0

    def __getattr__(self, name):
        return getattr(self.env, name)

    def step(self, actions):
        self.steps += 1
        if self.steps == self.at_step:
            raise RuntimeError(f"env exploded at step {self.steps}")
        return self.env.step(actions)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_env_error_fails_the_run_quickly_naming_the_thread(tmp_path):
    run = prepare(small(tmp_path, total_steps=10**6))
    run.actors[0].env = RaisingEnv(run.actors[0].env, at_step=40)
    start = time.perf_counter()
    with pytest.raises(
        ComponentError,
        match=r"actor-0 failed: EnvError: env.step raised at step 40 \(rollout \d+\): "
        r"RuntimeError: env exploded",
    ):
        run.run()
    assert time.perf_counter() - start < 30
    assert not podrace_threads()
    assert (run.run_dir / "metrics.jsonl").read_text().strip()


def test_impossible_layouts_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="device 9 does not exist"):
        prepare(small(tmp_path, **{"layout.learner_device_ids": (9,)}))
    with pytest.raises(ConfigError, match="divisible by the number of learner devices"):
        prepare(small(tmp_path, **{"layout.learner_device_ids": (0, 1, 2), "env.num_envs": 8}))
    with pytest.raises(ConfigError, match="unknown env id"):
        prepare(small(tmp_path, **{"env.id": "NoSuchEnv-v9"}))
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cartpole_ppo_learns(tmp_path):
    """Seed 1 evaluates 500 after these 60k steps; random play scores ~20."""
    cfg = small(tmp_path, **LEARNS)
    result = train(cfg)
    assert result.final_eval.mean_return >= 150, result.final_eval


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_continuous_actions_run_end_to_end(tmp_path):
    cfg = replace(
        PRESETS["pendulum-ppo"][1],
        total_steps=2 * 8 * 16 * 3,
        rollout_length=16,
        **{
            "env.num_envs": 8,
            "ppo.num_minibatches": 2,
            "eval.episodes": 2,
            "eval.num_envs": 2,
            "log.console": "none",
            "log.run_dir": str(tmp_path),
        },
    )
    run = prepare(cfg)
    batches = record_versions(run)
    result = run.run()
    assert result.updates == 3 and len(batches) == 3
    assert np.isfinite(result.final_eval.mean_return)


@pytest.mark.timeout(120)
def test_a_stop_that_closes_the_publisher_during_prepare_is_a_stop(tmp_path, monkeypatch):
    """A stop that closes the publisher before the learner's first publish (a SIGTERM during
    `--runtime ray` start-up) is a stop: prepare raises Stopped with nothing written, not
    ChannelClosed (a traceback, exit 1, config.json left behind)."""
    from podrace.control import Lifetime, Stopped
    from podrace.runtime import skeleton

    lifetime = Lifetime()
    original = skeleton.build_learner

    def stop_then_build(*args, **kwargs):
        lifetime.stop("SIGTERM received")  # the signal lands just after the publisher exists
        return original(*args, **kwargs)

    monkeypatch.setattr(skeleton, "build_learner", stop_then_build)
    with pytest.raises(Stopped):
        prepare(small(tmp_path), lifetime)
    assert list(tmp_path.iterdir()) == []


class CompileLog:
    """Records every XLA compile JAX logs while it is active (jax_log_compiles)."""

    def __init__(self):
        import logging

        self.messages: list[str] = []
        self.handler = logging.Handler()
        self.handler.emit = lambda record: self.messages.append(record.getMessage())
        self.loggers = [
            logging.getLogger(name) for name in ("jax._src.interpreters.pxla", "jax._src.dispatch")
        ]

    def __enter__(self):
        jax.config.update("jax_log_compiles", True)
        for logger in self.loggers:
            logger.addHandler(self.handler)
        return self

    def __exit__(self, *exc):
        jax.config.update("jax_log_compiles", False)
        for logger in self.loggers:
            logger.removeHandler(self.handler)

    @property
    def compiles(self) -> list[str]:
        return [m.split(" with ")[0] for m in self.messages if m.startswith("Compiling ")]


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "layout",
    [
        {},  # actors on the learner's device: rollouts and params are passed as they are
        {"layout.actor_device_ids": (1,)},  # rollouts moved to the learner, params to the actor
        {
            "layout.actor_device_ids": (0, 1),
            "layout.actors_per_device": 1,
        },  # one actor of each kind
        {"layout.learner_device_ids": (0, 1), "layout.actor_device_ids": (2,)},  # split over a mesh
    ],
)
def test_nothing_compiles_once_the_threads_run(tmp_path, layout):
    """Everything an actor, the learner and the evaluator run is compiled in prepare(): a
    placement that hands a program arrays of another sharding than it was compiled for
    would compile it again in the middle of training (seconds of a short run)."""
    run = prepare(small(tmp_path, **{"eval.every_updates": 4, **layout}))
    with CompileLog() as log:
        run.run()
    assert log.compiles == []


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_stop_before_the_first_update_leaves_no_run_directory(tmp_path):
    """A stop after the threads started but before the first update leaves no run directory:
    config.json, an empty checkpoints folder and one metrics line would be a run `--resume`
    refuses (it has no checkpoint)."""
    from podrace.control import Lifetime

    lifetime = Lifetime()
    run = prepare(small(tmp_path, **{"checkpoint.every_updates": 1}), lifetime)
    assert list(tmp_path.iterdir()) == [run.run_dir]
    lifetime.stop("SIGINT received")
    result = run.run()
    assert result.updates == 0 and result.checkpoint is None
    assert list(tmp_path.iterdir()) == []
