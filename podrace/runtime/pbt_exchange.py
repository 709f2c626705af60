"""Where a population's members meet: each member's latest learner state and score, and the
exploit/explore step a member takes at the end of each of its intervals.

`Exchange.attach` hooks a member's learner (`Learner.adopt`): after every update the member
leaves its new state here; when the update ends one of its intervals (`--pbt.interval-steps`
of its own env steps) it asks the controller (`podrace.pbt.controller`, pure) whether it
ranks in the bottom fraction, and if so continues from a top member's whole learner state
(params, optimizer state with the hyperparameters it carries, normalizer statistics) with
explored hyperparameters. The learner then publishes that state through the member's own
publisher as its next version: rollouts its actors still make with the old policy arrive
stamped with older versions, and the lag bound (`--layout.max-policy-lag`) and the per-version
observation statistics treat them as any late rollout. Each exploit is a line of
`RUN/pbt.jsonl`.

Scores come from the members' metric lines (`sink`), the values their metrics.jsonl holds:
a member is ranked on the last line's `--pbt.metric`, never on a value measured before its
last exploit (for an `eval/` metric: an evaluation of an older version).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Mapping

import jax

from podrace.algos.base import TrainState
from podrace.algos.normalizer import Normalizer
from podrace.algos.tunable import Tuned, replaced
from podrace.config import TrainConfig
from podrace.learner import Learner
from podrace.metrics.registry import Metrics
from podrace.pbt.config import MUTABLE
from podrace.pbt.controller import decision_rng, exploit_source, explore, intervals_done
from podrace.pbt.lineage import Lineage

log = logging.getLogger(__name__)


class MemberSink:
    """A metrics sink that hands a member's lines to the exchange (its scores)."""

    def __init__(self, exchange: Exchange, member: int):
        self.exchange, self.member = exchange, member

    def write(self, line: dict[str, float]) -> None:
        self.exchange.observe(self.member, line)

    def close(self) -> None:
        pass


class Exchange:
    """Every member's latest state and score; the exploit and explore steps."""

    def __init__(self, cfg: TrainConfig, lineage: Lineage):
        self.cfg = cfg
        self.pbt = cfg.pbt
        self.space = {name: MUTABLE[cfg.algo][name] for name in cfg.pbt.mutated(cfg.algo)}
        self.spu = cfg.steps_per_update
        self.lineage = lineage
        self._lock = threading.Lock()
        self._states: dict[int, tuple[TrainState, Normalizer | None, int]] = {}
        self.scores: dict[int, float] = {m: math.nan for m in range(cfg.pbt.population)}
        self.exploited_at: dict[int, int] = {}
        """The version each member last published a copied state at (scores older than it
        are not the member's)."""
        self._episodes_without_metric: set[int] = set()
        """Members whose lines held ended episodes but no `info/<key>` metric."""
        self._warned_unreported = False

    def sink(self, member: int) -> MemberSink:
        return MemberSink(self, member)

    def observe(self, member: int, line: Mapping[str, float]) -> None:
        """Take `--pbt.metric` from one of `member`'s metric lines as its score, unless the
        line measured a version before its last exploit."""
        value = line.get(self.pbt.metric)
        if not isinstance(value, (int, float)):
            if self.pbt.metric.startswith("info/") and "episode/return" in line:
                with self._lock:
                    self._episodes_without_metric.add(member)
            return
        measured = line.get("eval/version" if self.pbt.metric.startswith("eval/") else "version")
        with self._lock:
            if (measured or 0) <= self.exploited_at.get(member, -1):
                return
            self.scores[member] = float(value)

    def attach(self, member: int, learner: Learner, metrics: Metrics) -> None:
        """Hook `member`'s learner: every update leaves its state here and may exploit."""
        metrics.count("pbt/exploits", 0)

        def adopt(version: int):
            return self.after_update(member, learner, metrics, version)

        learner.adopt = adopt

    def after_update(
        self, member: int, learner: Learner, metrics: Metrics, version: int
    ) -> tuple[TrainState, Normalizer | None] | None:
        """Run in `member`'s learner thread before it publishes `version`: the state to
        publish instead of its update's (an exploit), or None."""
        steps = version * self.spu
        with self._lock:
            self._states[member] = (learner.state, learner.normalizer, steps)
        interval = intervals_done(steps, self.pbt.interval_steps)
        if interval == intervals_done(steps - self.spu, self.pbt.interval_steps):
            return None
        rng = decision_rng(self.cfg.seed, member, interval)
        with self._lock:
            scores = dict(self.scores)
        self._warn_if_unreported(member, scores)
        source = exploit_source(member, scores, self.pbt.bottom_fraction, rng)
        if source is None:
            return None
        with self._lock:
            copied = self._states.get(source)
        if copied is None:  # it has a score (from before a resume) but no update yet
            return None
        source_state, source_normalizer, source_steps = copied
        old = hyperparameters(learner.state)
        new = explore(
            hyperparameters(source_state),
            self.space,
            self.pbt.perturb_factors,
            self.pbt.resample_probability,
            rng,
        )
        state = TrainState(
            source_state.params, replaced(source_state.opt_state, new), learner.state.step
        )
        normalizer = adopted_normalizer(learner.normalizer, source_normalizer)
        with self._lock:
            self.exploited_at[member] = version
            self.scores[member] = scores[source]  # its new params' score, until it is measured
        self.lineage.write(
            {
                "member": member,
                "member_step": steps,
                "version": version,
                "interval": interval,
                "copied": source,
                "source_step": source_steps,
                "scores": {str(m): s for m, s in scores.items() if not math.isnan(s)},
                "old": old,
                "new": new,
                "time": time.time(),
            }
        )
        metrics.count("pbt/exploits")
        return state, normalizer

    def _warn_if_unreported(self, member: int, scores: Mapping[int, float]) -> None:
        """Warn once when `member` ends an interval, its episodes ended without the env
        reporting the `info/<key>` metric, and no member has a score: an env that never
        reports the key leaves the population unranked (it cannot be known before the envs
        run)."""
        with self._lock:
            unreported = (
                not self._warned_unreported
                and member in self._episodes_without_metric
                and all(math.isnan(score) for score in scores.values())
            )
            self._warned_unreported = self._warned_unreported or unreported
        if unreported:
            log.warning(
                "pbt.metric %s: member-%d's episodes ended without its env reporting "
                "info[%r], and no member is ranked (a key the env never reports?)",
                self.pbt.metric,
                member,
                self.pbt.metric.removeprefix("info/"),
            )

    def forget(self, member: int, steps: int) -> None:
        """`member` restarts from its checkpoint at `steps` env steps: its lineage after it
        is superseded, its state is no source until its next update, and its scores count
        again from the version of its last kept exploit."""
        with self._lock:
            self._states.pop(member, None)
            kept = self.lineage.keep_member_until(member, steps)
            if kept:
                self.exploited_at[member] = kept[-1]["version"]
            else:
                self.exploited_at.pop(member, None)


def hyperparameters(state: TrainState) -> dict[str, float]:
    """The hyperparameters a member's state carries, as host floats."""
    opt_state = state.opt_state
    assert isinstance(opt_state, Tuned), "a population member's update takes its inputs"
    return {name: float(v) for name, v in jax.device_get(opt_state.hyperparameters).items()}


def adopted_normalizer(own: Normalizer | None, source: Normalizer | None) -> Normalizer | None:
    """The source's observation and return statistics (they belong to its params); the
    per-env return tracker stays the member's own (it follows the member's envs)."""
    if own is None or source is None:
        return own
    return own._replace(obs=source.obs, returns=source.returns)


__all__ = ["Exchange", "MemberSink", "adopted_normalizer", "hyperparameters"]
