"""A resumed run continues every running total of the run it resumes, and names the
checkpoint it stands on from its first metrics line (thread and Ray topologies; the
multi-host one, where each process keeps its own, is in test_multihost_resume.py)."""

from __future__ import annotations

import json

import pytest

from podrace.checkpoints.resume import Resume
from podrace.config import replace
from podrace.presets import PRESETS
from podrace.runtime.run import prepare
from tests.runtime.topologies import TOPOLOGIES

SPU = 2 * 8 * 16  # actors x envs x rollout length


def small(tmp_path, topology: str, updates: int):
    return replace(
        PRESETS["cartpole-ppo"][1],
        **TOPOLOGIES[topology],
        **{
            "total_steps": SPU * updates,
            "rollout_length": 16,
            "env.num_envs": 8,
            "layout.actors_per_device": 2,
            "ppo.num_minibatches": 4,
            "eval.every_updates": 0,
            "eval.episodes": 2,
            "eval.num_envs": 2,
            "log.console": "none",
            "log.run_dir": str(tmp_path),
            "log.run_name": "r",
            "log.interval_s": 0.2,
        },
    )


def metric_lines(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("topology", ["threads", "ray"])
def test_every_counter_and_the_checkpoint_continue_across_a_resume(tmp_path, topology):
    """Restarts and lost credits counted before the stop (counted here as a Ray worker's
    restart counts them) are where the resumed run's counting starts, as are env steps
    and episodes; every line of the resumed run names a complete checkpoint, the one it
    resumed from until it writes the next."""
    first = prepare(small(tmp_path, topology, 3))
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
