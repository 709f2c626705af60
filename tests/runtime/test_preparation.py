"""A run's preparation compiles the learner's update, the actors and the evaluator at once
(each in a thread of its own), and fails as one when any of them fails."""

import threading

import pytest

from podrace.runtime.run import prepare
from tests.helpers.configs import small
from tests.waiting import wait_until


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_update_compiles_while_the_actors_and_the_evaluator_compile(tmp_path, monkeypatch):
    import podrace.actor as actor_module
    import podrace.evaluate as evaluate_module
    import podrace.runtime.skeleton as skeleton

    started = {"actor": threading.Event(), "evaluator": threading.Event()}
    actor_warm_up, evaluator_warm_up = actor_module.Actor.warm_up, evaluate_module.Evaluator.warm_up
    warm_up_learner = skeleton.warm_up_learner

    def actor(self, params):
        started["actor"].set()
        return actor_warm_up(self, params)

    def evaluator(self, params):
        started["evaluator"].set()
        return evaluator_warm_up(self, params)

    def learner(*args, **kwargs):
        # Queued one after the other, the actors and the evaluator would compile only
        # after this returns: the wait would fail.
        wait_until(lambda: all(e.is_set() for e in started.values()), 120)
        return warm_up_learner(*args, **kwargs)

    monkeypatch.setattr(actor_module.Actor, "warm_up", actor)
    monkeypatch.setattr(evaluate_module.Evaluator, "warm_up", evaluator)
    monkeypatch.setattr(skeleton, "warm_up_learner", learner)
    run = prepare(small(tmp_path, total_steps=2 * 8 * 16 * 2))
    result = run.run()
    assert result.updates == 2 and result.final_eval is not None
