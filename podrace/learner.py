"""The learner loop: one rollout per actor per update, the update, and the publish.

After each update the new params are blocked on, checked finite (with the normalization
statistics they are published with), and only then published
(version = updates applied). The sharded programs it runs are built in
`podrace.learner_mesh`; here they are plain callables, so the loop is tested with fakes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax

from podrace.algos.base import TrainState
from podrace.algos.normalization import RunningStats
from podrace.algos.normalizer import Normalizer, acting_params
from podrace.control import ExplainedError, Lifetime
from podrace.metrics.registry import Metrics
from podrace.pipeline import Pipeline
from podrace.sync.base import Publisher
from podrace.sync.versions import release_later
from podrace.types import Trajectory


class NonFiniteUpdate(ExplainedError, FloatingPointError):
    """The loss or gradients of an update, or the normalization statistics after it, were
    NaN/inf; those params (and statistics) are never published."""


class TooManySkippedUpdates(NonFiniteUpdate):
    """More updates were skipped as non-finite than the run allows (it is not training)."""


@dataclass(frozen=True)
class LearnerSettings:
    num_updates: int
    steps_per_update: int
    """Env steps consumed by one update (all actors together), for the `env_steps` counter."""
    skip_nonfinite: bool = False
    """Skip (and count) a non-finite update instead of failing the run."""
    max_skipped: int = 0
    """With skip_nonfinite: fail the run once more updates than this were skipped."""
    max_policy_lag: int = 1
    """Oldest behaviour version a batch may hold, as versions behind the learner: the
    observation statistics of that many past versions are kept to train on their rollouts."""


class Learner:
    """Consumes one rollout per actor per update, updates, and publishes the new params.

    `update_fn(state, trajectories, keys) -> (state, keys, metrics)` is the jitted sharded
    step (or a fake); `pipeline.next_batch(version)` supplies rollouts already on the mesh.

    With normalization, `normalizer` is its state (one pytree, checkpointable) and
    `normalize_fn` (see `podrace.learner_mesh.make_normalize_fn`) prepares each batch before
    the update: every rollout is normalized with the observation statistics of the version
    stamped on it, which the learner remembers for the last `max_policy_lag` versions. The
    normalizer changes only with an accepted (finite) update, and what is published is
    `acting_params(params, normalizer)`.
    """

    def __init__(
        self,
        settings: LearnerSettings,
        state: TrainState,
        keys: jax.Array,
        update_fn: Callable,
        pipeline: Pipeline,
        publisher: Publisher,
        metrics: Metrics,
        lifetime: Lifetime,
        on_update: Callable[[int], None] | None = None,
        normalizer: Normalizer | None = None,
        normalize_fn: Callable | None = None,
    ):
        self.settings = settings
        self.skipped = 0
        metrics.count("learner/skipped_nonfinite", 0)  # present in every line, 0 included
        self.state = state
        self.keys = keys
        self.update_fn = update_fn
        self.pipeline = pipeline
        self.publisher = publisher
        self.metrics = metrics
        self.lifetime = lifetime
        self.on_update = on_update
        self.normalizer = normalizer
        self.normalize_fn = normalize_fn
        self.adopt: Callable[[int], tuple[TrainState, Normalizer | None] | None] | None = None
        """Called with the version about to be published, after each update: a (state,
        normalizer) it returns is published in place of the update's (a population member
        copying another's learner state); None keeps the update's."""
        self._obs_stats: dict[int, RunningStats] = {}
        """Observation statistics published with each recent version (behaviour statistics)."""
        self.version = self._publish()

    def saved(self) -> dict:
        """What a checkpoint keeps of the learner (references, no copies): its train state,
        keys, normalizer statistics and the count of updates it skipped."""
        return {
            "train_state": self.state,
            "learner_keys": self.keys,
            "normalizer": self.normalizer,
            "skipped_updates": self.skipped,
        }

    def acting_params(self):
        """The pytree actors and the evaluator act with (what `publish` sends)."""
        return acting_params(self.state.params, self.normalizer)

    def _publish(self) -> int:
        version = self.publisher.publish(self.acting_params())
        if self.normalizer is not None and self.normalizer.obs is not None:
            self._obs_stats[version] = self.normalizer.obs
            oldest = version - self.settings.max_policy_lag
            for old in [v for v in self._obs_stats if v < oldest]:
                del self._obs_stats[old]
        return version

    def prepare(self, trajs: tuple[Trajectory, ...], versions: Sequence[int]):
        """(normalizer after this batch, the batch as the update consumes it, whether the
        normalizer's statistics are finite); `versions` are the behaviour versions of
        `trajs`. Without normalization: (None, trajs, True)."""
        if self.normalize_fn is None:
            return self.normalizer, trajs, True
        behaviour = ()
        if self.normalizer.obs is not None:
            missing = sorted(set(versions) - set(self._obs_stats))
            if missing:
                raise RuntimeError(
                    f"no observation statistics kept for behaviour version(s) {missing} (kept: "
                    f"{sorted(self._obs_stats)}); the lag bound is {self.settings.max_policy_lag}"
                )
            behaviour = tuple(self._obs_stats[v] for v in versions)
        return self.normalize_fn(self.normalizer, trajs, behaviour)

    def run(self) -> None:
        # From the first published version (0, or a resumed checkpoint's) to num_updates.
        for _ in range(self.settings.num_updates - self.version):
            self.lifetime.check()
            self.step()

    def step(self) -> None:
        rollouts, lag = self.pipeline.next_batch(self.version)
        start = time.perf_counter()
        trajs = tuple(r.trajectory for r in rollouts)
        normalizer, trajs, stats_finite = self.prepare(trajs, [r.policy_version for r in rollouts])
        state, keys, metrics = self.update_fn(self.state, trajs, self.keys)
        jax.block_until_ready(state.params)
        learner_step = time.perf_counter() - start
        metrics = jax.device_get(
            metrics
        )  # a fake's or a wrapper's arrays; UpdateFn's are on the host
        self.keys = keys
        finite = bool(metrics.pop("finite"))
        stats_finite = bool(stats_finite)
        if finite and stats_finite:
            self.state, self.normalizer = state, normalizer
        elif self.settings.skip_nonfinite:
            # Republish the old params under the next version so actors keep their pace.
            self.skipped += 1
            self.metrics.count("learner/skipped_nonfinite")
            if self.skipped > self.settings.max_skipped:
                raise TooManySkippedUpdates(
                    f"{self.skipped} of {self.settings.num_updates} updates skipped as non-finite, "
                    f"more than the {self.settings.max_skipped} that safety.max_skipped_fraction "
                    "allows"
                )
            metrics = {}
        else:
            what = (
                f"non-finite loss or gradients in update {self.version + 1} "
                f"(loss={metrics.get('loss')})"
                if not finite
                else f"non-finite observation or return statistics after update {self.version + 1} "
                f"(an observation or reward was inf or NaN)"
            )
            raise NonFiniteUpdate(f"{what}; params not published")
        if self.adopt is not None:
            adopted = self.adopt(self.version + 1)
            if adopted is not None:
                self.state, self.normalizer = adopted
        start = time.perf_counter()
        self.version = self._publish()
        publish = time.perf_counter() - start

        m = self.metrics
        m.add_many({f"learner/{k}": float(v) for k, v in metrics.items()})
        m.add_many({f"lag/{k}": v for k, v in lag.items() if k != "queue_get_wait"})
        m.add_many(
            {
                "learner/queue_get_wait": lag["queue_get_wait"],
                "learner/step": learner_step,
                "learner/publish": publish,
            }
        )
        m.set("lag/max_seen", max(m.last("lag/max_seen", 0.0), lag["lag_max"]))
        m.set("version", self.version)
        m.count("env_steps", self.settings.steps_per_update)
        for r in rollouts:
            m.add_values("episode/return", r.episode_returns)
            m.add_values("episode/length", r.episode_lengths)
            m.count("episodes", len(r.episode_returns))
            for key, values in (r.episode_info or {}).items():
                m.add_values(f"info/{key}", values)
        if self.on_update is not None:
            self.on_update(self.version)
        # Freeing a rollout's arrays releases and retakes the GIL once per array: on a busy
        # 2-core machine that is a millisecond of the learner's critical path per update.
        release_later((rollouts, trajs))
