"""Run directories as `podrace train` writes them, made up for the plot tests."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from podrace.config import TrainConfig, replace


def synthetic_run(
    run_dir: Path,
    env_id: str = "CartPole-v1",
    scale: float = 1.0,
    seed: int = 1,
    rollout_length: int = 32,
) -> TrainConfig:
    """A run directory as `podrace train` writes it: 3 metric lines, 10 updates apart."""
    cfg = replace(
        TrainConfig(), **{"env.id": env_id, "seed": seed, "rollout_length": rollout_length}
    )
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
    lines = []
    for i, version in enumerate((10, 20, 30)):
        lines.append(
            {
                "version": version,
                "env_steps": float(version * cfg.steps_per_update),
                "time_s": 1.5 * (i + 1),
                "episode/return": scale * 100.0 * (i + 1),
                "eval/return": scale * 50.0,  # the same evaluation is repeated until a new one
                "eval/version": 10,
                "actor/env_step": 0.01,
                "actor/inference": 0.02,
                "actor/device_to_host": 0.001,
                "actor/to_learner": 0.004,
                "actor/rollout": 0.04,
                "actor/queue_put_wait": 0.003,
                "learner/step": 0.1,
                "learner/queue_get_wait": 0.02,
                "learner/publish": 0.001,
            }
        )
    lines[-1]["eval/version"], lines[-1]["eval/return"] = 30, scale * 400.0
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return cfg
