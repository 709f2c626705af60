"""A member that fails restarts from its latest checkpoint while the others train on: the
population reaches its end, the member's counters continue from the checkpoint, and its
lineage holds each decision once."""

import logging

import pytest

from podrace.control import Lifetime
from podrace.runtime.faults import FaultPlan
from podrace.runtime.population import prepare_population
from podrace.runtime.run import prepare
from tests.helpers.configs import SMALL_SPU
from tests.helpers.populations import lineage, small_population
from tests.helpers.runs import metric_lines

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_a_failed_member_restarts_from_its_checkpoint_and_the_population_goes_on(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="podrace")
    cfg = small_population(tmp_path, total_steps=12 * SMALL_SPU, **{"checkpoint.every_updates": 2})
    builds = []

    def prepare_failing_once(member_cfg, lifetime, envs, resume, faults=None, **kwargs):
        """Member 1's first build: its actor 0 raises before its rollout 7."""
        builds.append((member_cfg.pbt.member, resume))
        if member_cfg.pbt.member == 1 and resume is None:
            faults = FaultPlan(actor_raise=(0, 7))
        return prepare(member_cfg, lifetime, envs, resume, faults=faults, **kwargs)

    population = prepare_population(cfg, Lifetime(), None, None, None, prepare_failing_once)
    result = population.run()
    root = result.run_dir
    assert [m.updates for m in result.members] == [12, 12]
    restarts = [(member, resume) for member, resume in builds if resume is not None]
    assert [member for member, _ in restarts] == [1], builds
    step = restarts[0][1].step
    assert 2 <= step <= 7
    warnings = [r.getMessage() for r in caplog.records if "restarting it" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("member-1 failed (")
    assert warnings[0].endswith(f"restarting it from its checkpoint at update {step}")
    for member in (0, 1):
        lines = [x for x in metric_lines(root / f"member-{member}") if "env_steps" in x]
        assert lines[-1]["version"] == 12 and lines[-1]["env_steps"] == 12 * SMALL_SPU
    exploits = lineage(root)
    assert len({(x["member"], x["member_step"]) for x in exploits}) == len(exploits)
