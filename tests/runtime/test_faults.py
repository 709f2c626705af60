"""Every injected fault ends the run within a bounded time, named, with metrics kept."""

import json
import threading
import time

import pytest

from podrace.control import ComponentError, HangDetected
from podrace.learner import NonFiniteUpdate
from podrace.runtime.faults import FaultPlan, InjectedFault
from podrace.runtime.run import prepare
from tests.helpers.configs import small
from tests.threads import podrace_threads

BOUND_S = 30


def run_with(tmp_path, plan, **changes):
    run = prepare(small(tmp_path, total_steps=10**7, **changes), faults=plan)
    start = time.perf_counter()
    with pytest.raises(ComponentError) as exc:
        run.run()
    elapsed = time.perf_counter() - start
    assert elapsed < BOUND_S, elapsed
    assert not podrace_threads(), threading.enumerate()
    lines = (run.run_dir / "metrics.jsonl").read_text().splitlines()
    assert lines and json.loads(lines[-1])["final"] == 1
    return exc.value


@pytest.mark.timeout(90)
def test_env_raises(tmp_path):
    error = run_with(tmp_path, FaultPlan(env_raise=(1, 30)))
    assert error.component == "actor-1"
    assert "env.step raised at step 30" in str(error)
    assert isinstance(error.error.__cause__, InjectedFault)


@pytest.mark.timeout(90)
def test_env_hangs_and_watchdog_fires(tmp_path):
    error = run_with(tmp_path, FaultPlan(env_hang=(0, 25)), **{"safety.watchdog_s": 2.0})
    assert error.component == "actor-0"
    assert isinstance(error.error, HangDetected)
    assert "env.step did not return within 2s (step 25)" in str(error)


@pytest.mark.timeout(90)
def test_nan_loss_stops_without_publishing(tmp_path):
    run = prepare(small(tmp_path, total_steps=10**7), faults=FaultPlan(nan_at_update=3))
    with pytest.raises(
        ComponentError, match="learner failed: NonFiniteUpdate: non-finite .* update 3"
    ) as exc:
        run.run()
    assert isinstance(exc.value.error, NonFiniteUpdate)
    assert run.learner.version == 2  # the NaN update was never published


@pytest.mark.timeout(90)
def test_nan_loss_skipped_and_counted_when_configured(tmp_path):
    run = prepare(
        small(tmp_path, **{"safety.on_nonfinite": "skip"}), faults=FaultPlan(nan_at_update=3)
    )
    result = run.run()
    assert result.updates == run.cfg.num_updates
    last = json.loads((run.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["learner/skipped_nonfinite"] == 1
    import jax
    import numpy as np

    for leaf in jax.tree.leaves(jax.device_get(run.learner.state.params)):
        assert np.isfinite(leaf).all()


@pytest.mark.timeout(90)
def test_actor_thread_raises(tmp_path):
    error = run_with(tmp_path, FaultPlan(actor_raise=(1, 4)))
    assert error.component == "actor-1" and "before rollout 4" in str(error)


@pytest.mark.timeout(90)
def test_evaluator_raises(tmp_path):
    error = run_with(tmp_path, FaultPlan(evaluator_raise=True), **{"eval.every_updates": 2})
    assert error.component == "evaluator" and "injected" in str(error)


@pytest.mark.timeout(90)
def test_slow_learner_shows_in_timers_and_run_completes(tmp_path):
    run = prepare(small(tmp_path), faults=FaultPlan(slow={"learner_step": 0.05}))
    run.run()
    lines = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    # Actors are visibly held back by the slow learner: by the lag bound or the full queue.
    waits = [ln.get("actor/params_wait", 0) + ln.get("actor/queue_put_wait", 0) for ln in lines]
    assert max(waits) > 0.02


@pytest.mark.timeout(90)
def test_lines_written_before_the_first_update_name_version_0(tmp_path):
    run = prepare(
        small(tmp_path, **{"log.interval_s": 0.05}), faults=FaultPlan(slow={"learner_step": 0.5})
    )
    run.run()
    lines = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    versions = [line["version"] for line in lines]
    assert versions[0] == 0 and versions == sorted(versions) and versions[-1] == run.learner.version
