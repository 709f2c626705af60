"""`--safety.on-nonfinite skip`: skipped updates are counted, reported, and a run that skips
more than `safety.max_skipped_fraction` of its updates fails instead of "succeeding"."""

import json

import jax
import jax.numpy as jnp
import pytest

from podrace.control import ComponentError
from podrace.learner import TooManySkippedUpdates
from podrace.runtime.run import prepare
from tests.helpers.configs import small


def poison_updates(run, count: int) -> None:
    """Make the first `count` updates see NaN rewards (so their loss is non-finite)."""
    update_fn, calls = run.learner.update_fn, [0]
    poison = jax.jit(lambda rewards: rewards * jnp.nan)  # jitted: no host-to-device transfer

    def update(state, trajs, keys):
        calls[0] += 1
        if calls[0] <= count:
            trajs = tuple(t._replace(rewards=poison(t.rewards)) for t in trajs)
        return update_fn(state, trajs, keys)

    run.learner.update_fn = update


def last_line(run) -> dict:
    return json.loads((run.run_dir / "metrics.jsonl").read_text().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_skips_up_to_the_limit_are_reported(tmp_path):
    # 12 updates, limit 0.25: 3 skipped updates are allowed.
    run = prepare(
        small(tmp_path, **{"safety.on_nonfinite": "skip", "safety.max_skipped_fraction": 0.25})
    )
    assert run.cfg.num_updates == 12
    poison_updates(run, 3)
    result = run.run()
    assert result.updates == 12 and result.skipped_updates == 3
    assert last_line(run)["learner/skipped_nonfinite"] == 3


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_more_skips_than_the_limit_fail_the_run(tmp_path):
    run = prepare(
        small(tmp_path, **{"safety.on_nonfinite": "skip", "safety.max_skipped_fraction": 0.25})
    )
    poison_updates(run, 12)
    with pytest.raises(
        ComponentError, match="4 of 12 updates skipped as non-finite, more than the 3"
    ) as exc:
        run.run()
    assert exc.value.component == "learner"
    assert isinstance(exc.value.error, TooManySkippedUpdates)
    assert last_line(run)["learner/skipped_nonfinite"] == 4
    assert run.learner.version == 3  # the fourth skipped update was not published


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_without_skips_the_count_is_still_reported(tmp_path):
    run = prepare(small(tmp_path, total_steps=8 * 2 * 16 * 4))
    run.run()
    assert last_line(run)["learner/skipped_nonfinite"] == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_resumed_run_keeps_its_skip_count_and_its_budget_over_all_its_updates(tmp_path):
    """8 updates, limit 0.25: 2 skips for the whole run, whether or not it was resumed. The
    first segment skips 1 and stops after update 4; resumed from copies of its checkpoint,
    1 more skip is within the budget (2 of 8) and 2 more are not (3 of 8). A resume that
    forgot the count (learner.skipped 0) would allow 2 more, and a budget over the 4
    remaining updates (1 skip) would fail the first copy."""
    import shutil

    from podrace.checkpoints.read import read_meta
    from podrace.checkpoints.resume import Resume
    from podrace.checkpoints.state import checkpoint_dir
    from tests.helpers.runs import stop_after

    cfg = small(
        tmp_path,
        **{
            "log.run_name": "a",
            "total_steps": 8 * 2 * 16 * 8,
            "safety.on_nonfinite": "skip",
            "safety.max_skipped_fraction": 0.25,
        },
    )
    first = prepare(cfg)
    poison_updates(first, 1)
    stop_after(first, 4)
    result = first.run()
    assert (result.updates, result.skipped_updates, result.checkpoint) == (4, 1, 4)
    assert read_meta(checkpoint_dir(first.run_dir))[1]["skipped_updates"] == 1
    shutil.copytree(tmp_path / "a", tmp_path / "b")

    within = prepare(None, resume=Resume(tmp_path / "a"))
    poison_updates(within, 1)
    result = within.run()
    assert (result.updates, result.skipped_updates, result.checkpoint) == (8, 2, 8)
    assert last_line(within)["learner/skipped_nonfinite"] == 2
    assert read_meta(checkpoint_dir(within.run_dir))[1]["skipped_updates"] == 2

    beyond = prepare(None, resume=Resume(tmp_path / "b"))
    poison_updates(beyond, 2)
    with pytest.raises(
        ComponentError, match="3 of 8 updates skipped as non-finite, more than the 2 "
    ):
        beyond.run()
    assert last_line(beyond)["learner/skipped_nonfinite"] == 3
