"""Small populations the PBT tests share, and what they leave in their run directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from podrace.config import TrainConfig
from tests.helpers.configs import SMALL_SPU, small

POPULATION_FLAGS = (
    "--rollout-length", "16", "--env.num-envs", "8", "--layout.actors-per-device", "2",
    "--ppo.num-minibatches", "4", "--eval.episodes", "2", "--eval.num-envs", "2",
    "--log.console", "none", "--log.interval-s", "0.2",
    "--pbt.population", "2", "--pbt.interval-steps", str(2 * SMALL_SPU),
    "--pbt.bottom-fraction", "0.5", "--eval.every-updates", "2",
)  # fmt: skip
"""`podrace train cartpole-ppo` flags of `small_population`'s population."""


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
