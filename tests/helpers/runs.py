"""Runs steered from a test, and what they leave in their run directory, read back."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import jax

import podrace
from podrace.runtime.run import prepare
from tests.helpers.configs import SMALL_SPU, small

T = TypeVar("T")


def metric_lines(run_dir: Path) -> list[dict]:
    """The lines of `run_dir`'s metrics.jsonl, parsed; none while the file does not exist."""
    path = run_dir / "metrics.jsonl"
    return [json.loads(t) for t in path.read_text().splitlines()] if path.exists() else []


def last_line(run_dir: Path) -> dict:
    """The last line of `run_dir`'s metrics.jsonl, parsed (the run's final line once it ended)."""
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])


def stop_after(
    run, version: int, reason: str = "test: stop", first: Callable[[], object] | None = None
) -> None:
    """Stop a prepared run right after update `version` (as a signal would, but at a known
    update) for `reason`; `first` runs just before the stop."""
    after = run.learner.on_update

    def hook(v: int) -> None:
        after(v)
        if v == version:
            if first is not None:
                first()
            run.lifetime.stop(reason)

    run.learner.on_update = hook


def factory_run(tmp_path: Path, factory: Callable, **changes) -> Path:
    """A run trained from Python, `podrace.train(cfg, env_factory=factory)`: 2 updates of
    `small`, its checkpoint at the end. `cfg.env.id` keeps CartPole's id."""
    base = {"log.run_name": "f", "network.hidden_sizes": (8,), "total_steps": 2 * SMALL_SPU}
    cfg = small(tmp_path, **{**base, **changes})
    return podrace.train(cfg, env_factory=factory).run_dir


def record_batches(run, what: Callable[[int, list], T]) -> list[T]:
    """Wraps a prepared run's pipeline: the list it returns gets `what(version, rollouts)` of
    every batch the learner takes, in order, as it takes them."""
    seen: list[T] = []
    next_batch = run.pipeline.next_batch

    def recording(version):
        rollouts, stats = next_batch(version)
        seen.append(what(version, rollouts))
        return rollouts, stats

    run.pipeline.next_batch = recording
    return seen


def final_params(cfg) -> tuple[object, object, object]:
    """Prepares and runs `cfg`: its learner's final params (on the host), the result, the run."""
    run = prepare(cfg)
    result = run.run()
    return jax.device_get(run.learner.state.params), result, run
