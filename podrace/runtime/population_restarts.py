"""A population's failed member goes on from its own latest checkpoint, the others meanwhile.

When a member's run fails (its Ray workers over `--ray.max-restarts`, an env that raised, a
lost node its workers could not come back from), the population does not stop: the member
is built again from its latest checkpoint (as `podrace train --resume` would: counters,
hyperparameters and learner state from the checkpoint; a Ray member's workers as new
incarnations) and trains on. Its lineage lines after that checkpoint move to
`pbt-superseded.jsonl` (decisions it takes again), and the exchange forgets its state
until its next update, so no member copies the failed one meanwhile.

A member that fails again before it saved a newer checkpoint than the one it restarted
from, or that has no checkpoint, fails the population (a crash loop is no progress).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from podrace.checkpoints.resume import Resume, stored_config
from podrace.config import ConfigError, TrainConfig
from podrace.control import Lifetime
from podrace.runtime.skeleton import Run

log = logging.getLogger(__name__)

Rebuild = Callable[[TrainConfig, Resume, Lifetime], Run]
"""(the member's config, its checkpoint, a new lifetime) -> the member's run, built."""


class MemberRestarts:
    """Decides whether a failed member restarts, and from which checkpoint."""

    def __init__(self, root: Path, rebuild: Rebuild) -> None:
        self.root, self.rebuild = root, rebuild
        self.restarted_from: dict[int, int] = {}
        """member -> the checkpoint step it last restarted from."""
        self._lock = threading.Lock()

    def checkpoint_to_restart_from(self, member: int, error: BaseException) -> int | None:
        """The latest checkpoint step of `member`, failed with `error`, if it restarts from
        it (said in a warning), else None (no checkpoint, or none newer than the one it last
        restarted from)."""
        try:
            step, _ = stored_config(Resume(self.root / f"member-{member}"))
        except ConfigError:
            return None  # no checkpoint (or a damaged one): nothing to continue from
        with self._lock:
            if step <= self.restarted_from.get(member, -1):
                return None
            self.restarted_from[member] = step
        log.warning(
            "member-%d failed (%s); restarting it from its checkpoint at update %d",
            member,
            describe(error),
            step,
        )
        return step

    def build(self, member: int, cfg: TrainConfig, step: int, lifetime: Lifetime) -> Run:
        """`member`'s run continued from its checkpoint `step`."""
        resume = Resume(self.root / f"member-{member}", step, step_was_latest=True)
        return self.rebuild(cfg, resume, lifetime)


def describe(error: BaseException) -> str:
    """One line for a member's failure."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


__all__ = ["MemberRestarts", "Rebuild", "describe"]
