"""Small populations the PBT tests share, and what they leave in their run directory."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from podrace.checkpoints.state import checkpoint_dir
from podrace.config import TrainConfig
from tests.helpers.cli import ENDLESS, run_flags, run_podrace, start_podrace
from tests.helpers.configs import SMALL_SPU, small
from tests.helpers.runs import metric_lines
from tests.waiting import wait_until

POPULATION_FLAGS = (
    "--rollout-length", "16", "--env.num-envs", "8", "--layout.actors-per-device", "2",
    "--ppo.num-minibatches", "4", "--eval.episodes", "2", "--eval.num-envs", "2",
    "--log.console", "none", "--log.interval-s", "0.2",
    "--pbt.population", "2", "--pbt.interval-steps", str(2 * SMALL_SPU),
    "--pbt.bottom-fraction", "0.5", "--eval.every-updates", "2",
)  # fmt: skip
"""`podrace train cartpole-ppo` flags of `small_population`'s population."""


POPULATION_RUN_MARKS = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.filterwarnings("ignore:os.fork", "ignore::UserWarning"),
]
"""`pytestmark` of a module whose tests run whole populations, on Ray among them: end to end,
minutes each under load, and Ray's warnings about forking a threaded process."""


def small_population(tmp_path: Path, **changes: Any) -> TrainConfig:
    """`small` (2 actor threads x 8 envs x 16 steps a member) as a population of 2 ranked on
    evaluations every 2 updates, each member's interval 2 updates: the worse one copies
    the better at each of its intervals."""
    base = {
        "pbt.population": 2,
        "pbt.interval_steps": 2 * SMALL_SPU,
        "pbt.bottom_fraction": 0.5,
        "eval.every_updates": 2,
    }
    return small(tmp_path, **{**base, **changes})


def small_ray_population(tmp_path: Path, **changes: Any) -> TrainConfig:
    """`small_population` with each member's actor a Ray worker (one worker of 8 envs x 16
    steps a member: `RAY_MEMBER_SPU` env steps an update), intervals of 4 updates."""
    base = {"runtime": "ray", "ray.num_workers": 1, "log.interval_s": 0.5}
    return small_population(tmp_path, **{**base, **changes})


RAY_MEMBER_SPU = 8 * 16
"""Env steps per update of a `small_ray_population` member."""

RAY_POPULATION_FLAGS = (*POPULATION_FLAGS, "--runtime", "ray", "--ray.num-workers", "1")
"""`podrace train cartpole-ppo` flags of `small_ray_population`'s population."""


def lineage(root: Path) -> list[dict]:
    path = root / "pbt.jsonl"
    return [json.loads(t) for t in path.read_text().splitlines()] if path.exists() else []


def stop_then_resume_population(
    tmp_path: Path, flags: tuple[str, ...], spu: int
) -> tuple[Path, str]:
    """`podrace train cartpole-ppo` with `flags` (a population of 2, `spu` env steps an
    update, a checkpoint every 4 updates) is stopped by SIGINT once both members passed
    update 8, then resumed to update 24. Checks that the lineage the checkpoints carry is
    kept as it was, nothing is there twice, and each member continues its own counters
    and exploit count; returns the run's root and what the stopped run printed."""
    total = 24 * spu
    flags = (*flags, "--checkpoint.every-updates", "4")
    proc = start_podrace("train", "cartpole-ppo", *run_flags(tmp_path, ENDLESS), *flags)
    root = tmp_path / "r"
    try:
        wait_until(
            lambda: (
                all(
                    any(line.get("version", 0) >= 8 for line in metric_lines(root / f"member-{m}"))
                    for m in (0, 1)
                )
                or proc.poll() is not None
            ),
            timeout=400,
        )
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGINT, err
    before = lineage(root)
    saved = {m: _latest_checkpoint(root / f"member-{m}") for m in (0, 1)}
    assert all(step >= 8 for step in saved.values()), saved

    done = run_podrace("train", "--resume", str(root), "--total-steps", str(total), timeout=400)
    assert done.returncode == 0, done.stderr
    after = lineage(root)
    kept = [x for x in before if x["member_step"] <= saved[x["member"]] * spu]
    assert after[: len(kept)] == kept
    assert len({(x["member"], x["member_step"]) for x in after}) == len(after)
    for m in (0, 1):
        lines = metric_lines(root / f"member-{m}")
        assert lines[-1]["version"] == 24 and lines[-1]["env_steps"] == total
        steps = [line["env_steps"] for line in lines]
        assert steps == sorted(steps)  # the resumed member continues its own counters
        assert lines[-1]["pbt/exploits"] == len([x for x in after if x["member"] == m])
    return root, err


def _latest_checkpoint(member_dir: Path) -> int:
    return max(int(p.name) for p in checkpoint_dir(member_dir).iterdir() if p.name.isdigit())
