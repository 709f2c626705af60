"""The batched-env interface every backend implements, and per-env seed derivation."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from podrace.types import EnvSpec, EnvStep


@runtime_checkable
class BatchedEnv(Protocol):
    """`num_envs` copies of one environment, stepped together on the host.

    Autoreset is next-step (see `podrace.types`): the step after a terminated/truncated one
    resets that env, ignores its action and returns reward 0 with the new first obs.
    """

    spec: EnvSpec
    num_envs: int

    def reset(self) -> np.ndarray:
        """Reset every env; returns obs [num_envs, *obs_shape]. Episode statistics restart."""
        ...

    def step(self, actions: np.ndarray) -> EnvStep:
        """Apply one action per env (int32 [num_envs] or float [num_envs, A])."""
        ...

    def close(self) -> None: ...


def env_seeds(seed: int, num_envs: int) -> list[int]:
    """Independent int31 seeds for `num_envs` envs, derived from one non-negative seed.

    Backends would otherwise use seed + i for env i, so an actor seeded s and one seeded s + 1
    would run identical envs; hashing through SeedSequence keeps every env distinct.
    """
    state = np.random.SeedSequence(seed).generate_state(num_envs, dtype=np.uint32)
    return [int(s >> 1) for s in state]
