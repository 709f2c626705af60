"""A resumed run continues every running total of the run it resumes, and names the
checkpoint it stands on from its first metrics line (thread and Ray topologies; the
multi-host one, where each process keeps its own, is in test_multihost_resume.py)."""

from __future__ import annotations

import pytest

from podrace.checkpoints.resume import Resume
from podrace.config import replace
from podrace.runtime.run import prepare
from tests.helpers.configs import SMALL_SPU as SPU
from tests.helpers.configs import small
from tests.helpers.runs import metric_lines
from tests.runtime.topologies import TOPOLOGIES


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("topology", ["threads", "ray"])
def test_every_counter_and_the_checkpoint_continue_across_a_resume(tmp_path, topology):
    """Restarts and lost credits counted before the stop (counted here as a Ray worker's
    restart counts them) are where the resumed run's counting starts, as are env steps
    and episodes; every line of the resumed run names a complete checkpoint, the one it
    resumed from until it writes the next."""
    first = prepare(
        small(tmp_path, **TOPOLOGIES[topology], total_steps=SPU * 3, **{"log.run_name": "r"})
    )
    first.metrics.count("ray/restarts", 3)
    first.metrics.count("ray/lost_credits", 5)
    first.run()
    before = metric_lines(tmp_path / "r")
    last = before[-1]
    assert (last["ray/restarts"], last["ray/lost_credits"], last["checkpoint/version"]) == (3, 5, 3)

    resumed = prepare(replace(first.cfg, total_steps=SPU * 6), resume=Resume(tmp_path / "r"))
    resumed.run()
    after = metric_lines(tmp_path / "r")[len(before) :]
    assert after and after[-1]["version"] == 6
    for line in after:
        assert line["ray/restarts"] == 3 and line["ray/lost_credits"] == 5, line
        assert line.get("checkpoint/version", 0) >= 3, line
        for name in ("env_steps", "episodes"):
            assert line[name] >= last[name], (name, line)
    assert after[-1]["env_steps"] == SPU * 6
