"""Envs stepped whole in this process and split among env worker processes, side by side."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from podrace.envs import EnvSource
from podrace.envs.workers import WorkerEnv
from podrace.types import EnvSpec, EnvStep


def assert_workers_step_as_one(
    source: EnvSource,
    spec: EnvSpec,
    num_envs: int,
    seed: int,
    workers: int,
    steps: int,
    action_dtype: type,
    check: Callable[[EnvStep], None] = lambda step: None,
) -> None:
    """`num_envs` envs of `source` seeded with `seed`, made whole here and split among
    `workers` env worker processes, reset and then stepped `steps` times with the same random
    actions: every field of every step is the same (and `check` holds for the workers')."""
    whole = source.make(num_envs, seed)
    parts = WorkerEnv(source, spec, num_envs, seed, workers=workers)
    try:
        np.testing.assert_array_equal(whole.reset(), parts.reset())
        rng = np.random.default_rng(0)
        for _ in range(steps):
            actions = rng.integers(0, spec.num_actions, num_envs).astype(action_dtype)
            a, b = whole.step(actions), parts.step(actions)
            check(b)
            for field in a._fields:
                np.testing.assert_array_equal(getattr(a, field), getattr(b, field), field)
    finally:
        whole.close()
        parts.close()
