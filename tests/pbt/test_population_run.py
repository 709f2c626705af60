"""A population end to end, on a tiny budget: members train side by side, exploit through
their publishers without a new compile, and a stopped population resumes whole."""

import pytest

from podrace.control import Lifetime
from podrace.runtime.population import prepare_population
from podrace.runtime.run import prepare
from tests.helpers.configs import SMALL_SPU
from tests.helpers.populations import (
    POPULATION_FLAGS,
    lineage,
    small_population,
    stop_then_resume_population,
)
from tests.helpers.runs import metric_lines

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_members_train_and_exploit_without_a_new_compile(tmp_path):
    # Intervals of 4 updates: a member's compiled update has every cache entry it will have
    # once its second update ran (the first adds one), before its first exploit.
    cfg = small_population(
        tmp_path, total_steps=16 * SMALL_SPU, **{"pbt.interval_steps": 4 * SMALL_SPU}
    )
    population = prepare_population(cfg, Lifetime(), None, None, None, prepare)
    entries = {}  # each member's compiled update's cache entries after its third update
    for member in population.members:
        learner, after = member.run.learner, member.run.learner.on_update

        def first_update(version, learner=learner, after=after, index=member.index):
            if version == 3:
                entries[index] = learner.update_fn.jitted._cache_size()
            after(version)

        learner.on_update = first_update
    result = population.run()
    root = result.run_dir
    assert sorted(p.name for p in root.iterdir()) == [
        "config.json", "member-0", "member-1", "pbt.jsonl"
    ]  # fmt: skip
    assert [m.updates for m in result.members] == [16, 16]
    assert result.env_steps == 2 * 16 * SMALL_SPU
    lines = lineage(root)
    assert lines, "no member exploited the other"
    for line in lines:
        assert line["copied"] == 1 - line["member"]
        assert line["member_step"] % cfg.pbt.interval_steps == 0
        assert line["member_step"] == line["version"] * SMALL_SPU
    for member in population.members:
        # No member compiled its update again for the hyperparameters it was given since.
        assert member.run.learner.update_fn.jitted._cache_size() == entries[member.index]
        # Rollouts of a policy replaced by an exploit were taken within the lag bound.
        assert member.run.metrics.last("lag/max_seen") <= cfg.max_policy_lag
        member_lines = metric_lines(root / f"member-{member.index}")
        assert any({"learner/hp/learning_rate", "learner/hp/gamma"} <= set(x) for x in member_lines)
        exploits = [x for x in lines if x["member"] == member.index]
        assert member_lines[-1]["pbt/exploits"] == len(exploits)


def test_a_stopped_population_resumes_every_member_and_its_lineage(tmp_path):
    root, err = stop_then_resume_population(tmp_path, POPULATION_FLAGS, SMALL_SPU)
    assert f"podrace train --resume {root}" in err
