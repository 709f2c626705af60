"""Normalization in a running system: what an actor acted with is the version stamped on its
rollout (params AND observation statistics), and the learner trains with those statistics.

The env's observations sit around 500, far from the initial statistics (mean 0, var 1):
acting with the wrong version's statistics, or without them, gives visibly different values.
"""

from __future__ import annotations

import dataclasses

import gymnasium
import jax
import numpy as np
import pytest

import podrace
from podrace.algos.normalization import normalize
from podrace.envs import EnvSource
from podrace.networks import make_network
from podrace.runtime.run import prepare
from tests.envs.user_envs import MATCH_LENGTH, RANDOM_RETURN, MatchEnv

OFFSET = 500.0


class ShiftedMatchEnv(MatchEnv):
    """MatchEnv whose one-hot observations are scaled by 3 and shifted by OFFSET."""

    observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32)

    def _draw(self) -> np.ndarray:
        return super()._draw() * 3.0 + OFFSET


def shifted_factory(num_envs: int, seed: int) -> gymnasium.vector.VectorEnv:
    return gymnasium.vector.SyncVectorEnv([ShiftedMatchEnv] * num_envs)


def config(tmp_path, **normalize):
    base = podrace.presets.get("cartpole-ppo")
    return dataclasses.replace(
        base,
        total_steps=8192,
        env=dataclasses.replace(base.env, id="unused-with-a-factory", num_envs=32),
        normalize=podrace.NormalizeConfig(**normalize),
        layout=dataclasses.replace(base.layout, actors_per_device=2, learner_device_ids=(0, 1)),
        eval=dataclasses.replace(base.eval, every_updates=0, episodes=16),
        log=dataclasses.replace(base.log, run_dir=str(tmp_path), console="none"),
    )


def record(run):
    """Record every published snapshot (host copies) and every consumed batch."""
    published = {run.learner.version: jax.device_get(run.learner.acting_params())}
    publish = run.publisher.publish

    def recording_publish(tree):
        version = publish(tree)
        published[version] = jax.device_get(tree)
        return version

    batches, behaviour_used = [], []
    next_batch = run.pipeline.next_batch

    def recording_next_batch(version):
        rollouts, lag = next_batch(version)
        batches.append([(r.policy_version, jax.device_get(r.trajectory)) for r in rollouts])
        return rollouts, lag

    normalize_fn = run.learner.normalize_fn

    def recording_normalize(normalizer, trajs, behaviour):
        behaviour_used.append(jax.device_get(behaviour))
        return normalize_fn(normalizer, trajs, behaviour)

    run.publisher.publish = recording_publish
    run.pipeline.next_batch = recording_next_batch
    run.learner.normalize_fn = recording_normalize
    return published, batches, behaviour_used


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_rollouts_use_the_statistics_of_their_stamped_version_and_learn(tmp_path):
    cfg = config(tmp_path, obs=True, reward=True)
    run = prepare(cfg, envs=EnvSource(cfg.env, shifted_factory))
    published, batches, behaviour_used = record(run)
    result = run.run()

    spec = EnvSource(cfg.env, shifted_factory).spec()
    apply = jax.jit(make_network(cfg.network, spec).apply)
    clip = cfg.normalize.obs_clip

    def values(version: int, stats_version: int | None, obs: np.ndarray) -> np.ndarray:
        x = (
            obs
            if stats_version is None
            else normalize(published[stats_version]["obs_stats"], obs, clip)
        )
        return np.asarray(apply(published[version]["params"], x)[1])

    versions_seen = set()
    for batch, behaviour in zip(batches, behaviour_used, strict=True):
        for (version, traj), stats in zip(batch, behaviour, strict=True):
            versions_seen.add(version)
            # The actor's behaviour values are those of version v's params on obs normalized
            # with version v's statistics ...
            np.testing.assert_allclose(
                traj.values, values(version, version, traj.obs), rtol=1e-4, atol=1e-4
            )
            # ... visibly not those without normalization or with another version's statistics.
            assert np.abs(traj.values - values(version, None, traj.obs)).max() > 1e-2
            other = 0 if version > 0 else max(published)
            assert np.abs(traj.values - values(version, other, traj.obs)).max() > 1e-2
            # The learner normalized this rollout with the same statistics.
            for got, want in zip(stats, published[version]["obs_stats"]):
                np.testing.assert_array_equal(got, want)
    assert len(versions_seen) >= 4
    # Statistics learned the shifted observations (one-hot * 3 + OFFSET: mean OFFSET + 0.75).
    np.testing.assert_allclose(published[max(published)]["obs_stats"].mean, OFFSET + 0.75, atol=0.1)
    assert result.final_eval.mean_return >= 0.75 * MATCH_LENGTH > 2 * RANDOM_RETURN
