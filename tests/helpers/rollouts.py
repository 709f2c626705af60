"""Rollouts without data, for the pipelines' bookkeeping (order, credits, stamps)."""

from __future__ import annotations

import numpy as np

from podrace.types import Rollout


def empty_rollout(actor_id: int, seq: int, version: int, restart: int = 0) -> Rollout:
    """Rollout `seq` of actor (or Ray worker) `actor_id`'s incarnation `restart`, acted with
    params `version`: no trajectory, no episodes, no timings."""
    return Rollout(
        actor_id,
        seq,
        version,
        trajectory=None,
        episode_returns=np.zeros(0),
        episode_lengths=np.zeros(0),
        timings={},
        restart=restart,
    )
