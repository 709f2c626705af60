"""Small training configs the runtime, resume and CLI tests share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from podrace.config import TrainConfig, replace
from podrace.presets import PRESETS

CARTPOLE = PRESETS["cartpole-ppo"][1]
SMALL_SPU = 2 * 8 * 16
"""Env steps per update of `small`: 2 actors x 8 envs x 16 steps."""


def small(tmp_path: Path, **changes: Any) -> TrainConfig:
    """A short cartpole-ppo run: 12 updates of 2 actor threads x 8 envs x 16 steps, 2-episode
    evaluations only at the end, no console, metrics every 0.2 s, its run under `tmp_path`;
    `changes` (dotted keys) replace any of it."""
    base = {
        "total_steps": 12 * SMALL_SPU,
        "rollout_length": 16,
        "env.num_envs": 8,
        "layout.actors_per_device": 2,
        "ppo.num_minibatches": 4,
        "eval.every_updates": 0,
        "eval.episodes": 2,
        "eval.num_envs": 2,
        "log.console": "none",
        "log.run_dir": str(tmp_path),
        "log.interval_s": 0.2,
    }
    return replace(CARTPOLE, **{**base, **changes})


LEARNS = {
    "total_steps": 60_000,
    "rollout_length": 32,
    "seed": 1,
    "eval.episodes": 8,
    "eval.num_envs": 8,
}
"""Changes under which `small` learns CartPole: seed 1 evaluates 500 after these 60k steps
(random play scores ~20), with 2 actor threads or 2 Ray workers."""


def small_ray(tmp_path: Path, **changes: Any) -> TrainConfig:
    """`small` with 2 Ray workers (8 envs each) in place of the 2 actor threads, metrics
    every 0.5 s."""
    ray = {
        "runtime": "ray",
        "ray.num_workers": 2,
        "layout.actors_per_device": CARTPOLE.layout.actors_per_device,
        "log.interval_s": 0.5,
    }
    return small(tmp_path, **{**ray, **changes})


def tiny_config(**changes: Any) -> TrainConfig:
    """The default config with an 8-unit network and 3 checkpoints kept: for checkpoint
    files, built without training."""
    return replace(TrainConfig(), **{"network.hidden_sizes": (8,), "checkpoint.keep": 3, **changes})
