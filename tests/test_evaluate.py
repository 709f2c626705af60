"""The evaluator alone, with fakes: a scripted env, a constant policy, a fake params source."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podrace.control import Control, Heartbeat, Lifetime, Stopped
from podrace.evaluate import Evaluator, run_episodes
from podrace.metrics.registry import Metrics
from tests.test_actor import FakeParams, ScriptedEnv

pytestmark = pytest.mark.timeout(60)


def policy(params, obs):
    return jnp.zeros(obs.shape[0], jnp.int32)


def control(lifetime=None):
    return Control(lifetime or Lifetime(), Heartbeat("evaluator"), lambda metrics: None)


def test_run_episodes_returns_exactly_the_episodes_asked_for():
    # Env 0 ends episodes at steps 2 and 5, env 1 at step 2: three episodes by step 5.
    env = ScriptedEnv([{2: "terminated", 5: "truncated"}, {2: "terminated"}])
    returns, lengths = run_episodes(env, jax.jit(policy), None, jax.devices()[0], 1, control())
    assert env.steps == 2  # two episodes ended together; one was asked for
    assert returns.tolist() == [2.0] and lengths.tolist() == [2]


def test_a_stop_is_seen_within_one_evaluation_step():
    lifetime = Lifetime()

    def stop_at(step):
        if step == 3:
            lifetime.stop("test")

    env = ScriptedEnv([{50: "terminated"}, {}], on_step=stop_at)
    with pytest.raises(Stopped):
        run_episodes(env, jax.jit(policy), None, jax.devices()[0], 1, control(lifetime))
    assert env.steps == 3


def test_every_evaluation_step_is_watched_by_the_heartbeat():
    seen = []
    ctl = control()

    def in_step(step):
        seen.append(ctl.heartbeat.overdue(1e12, 1.0))

    env = ScriptedEnv([{2: "terminated"}, {2: "terminated"}], on_step=in_step)
    run_episodes(env, jax.jit(policy), None, jax.devices()[0], 1, ctl)
    assert seen == [f"evaluation env.step did not return within 1s (step {s})" for s in (1, 2)]


def test_final_evaluation_returns_when_the_run_stops():
    lifetime = Lifetime()
    evaluator = Evaluator(ScriptedEnv([{}, {}]), jax.devices()[0], jax.jit(policy), FakeParams(), 1, Metrics(),
                          control(lifetime))
    # No evaluator thread runs: only the stop can end the wait.
    outcome = []

    def final():
        try:
            evaluator.evaluate_final(0)
        except Stopped:
            outcome.append("stopped")

    waiter = threading.Thread(target=final, daemon=True)
    waiter.start()
    waiter.join(0.2)
    lifetime.stop("test")
    waiter.join(10)
    assert not waiter.is_alive() and outcome == ["stopped"]


def test_busy_evaluator_drops_and_counts_requests():
    metrics = Metrics()
    evaluator = Evaluator(ScriptedEnv([{}, {}]), jax.devices()[0], jax.jit(policy), FakeParams(), 1, metrics,
                          control())
    evaluator.request(1)
    evaluator.request(2)
    evaluator.request(3)
    assert metrics.total("eval/dropped_requests") == 2
    np.testing.assert_equal(len(evaluator.requests), 1)
