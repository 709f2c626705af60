"""`Learner.run` alone with fakes (and once with the real sharded update)."""

from typing import NamedTuple

import jax
import numpy as np
import pytest

from podrace.algos.normalization import RunningStats
from podrace.algos.normalizer import Normalizer
from podrace.config import EnvConfig, LayoutConfig, NetworkConfig, PPOConfig, TrainConfig
from podrace.control import Lifetime
from podrace.learner import Learner, LearnerSettings, NonFiniteUpdate, TooManySkippedUpdates
from podrace.learner_mesh import env_keys
from podrace.metrics.registry import Metrics
from podrace.pipeline import Pipeline
from podrace.sync.local import LocalPublisher
from podrace.types import Rollout
from tests import trajectories
from tests.helpers.learners import sharded_update

T, B = trajectories.ROLLOUT_LENGTH, trajectories.ENVS


class FakeState(NamedTuple):
    params: dict


def stamped(actor_id, seq, version, traj=None):
    return Rollout(
        actor_id,
        seq,
        version,
        trajectory=traj,
        episode_returns=np.array([1.0]),
        episode_lengths=np.array([3]),
        timings={},
    )


def fake_learner(
    update_fn, updates=3, actors=1, skip=False, state=None, keys=None, max_skipped=0, publisher=None
):
    lifetime = Lifetime()
    pipeline = Pipeline(actors, capacity=updates, max_policy_lag=1, lifetime=lifetime)
    publisher = publisher or LocalPublisher()
    learner = Learner(
        LearnerSettings(updates, steps_per_update=10, skip_nonfinite=skip, max_skipped=max_skipped),
        state or FakeState({"w": np.zeros(())}),
        keys if keys is not None else np.zeros(2),
        update_fn,
        pipeline,
        publisher,
        Metrics(),
        lifetime,
    )
    return learner, pipeline, publisher


@pytest.mark.timeout(60)
def test_learner_run_consumes_updates_publishes_and_counts():
    seen = []

    def update(state, trajs, keys):
        seen.append(trajs)
        return FakeState({"w": state.params["w"] + 1}), keys + 1, {"finite": True, "loss": 0.5}

    learner, pipeline, publisher = fake_learner(update)
    for seq in range(3):
        for actor in (0,):
            pipeline.put(stamped(actor, seq, max(seq - 1, 0), traj=f"traj-{seq}"))
    learner.run()
    assert [t for (t,) in seen] == ["traj-0", "traj-1", "traj-2"]
    assert learner.version == 3 and publisher.latest_version == 3
    assert learner.state.params["w"] == 3
    assert learner.metrics.total("env_steps") == 30 and learner.metrics.total("episodes") == 3
    assert learner.metrics.last("lag/max_seen") == 1


@pytest.mark.timeout(60)
def test_learner_never_publishes_a_nonfinite_update():
    def update(state, trajs, keys):
        return FakeState({"w": np.nan}), keys, {"finite": False, "loss": np.nan}

    learner, pipeline, publisher = fake_learner(update)
    pipeline.put(stamped(0, 0, 0))
    with pytest.raises(NonFiniteUpdate, match="update 1"):
        learner.run()
    assert publisher.latest_version == 0 and learner.state.params["w"] == 0


@pytest.mark.parametrize("skip", [False, True], ids=["fail", "skip"])
@pytest.mark.timeout(60)
def test_learner_never_accepts_or_publishes_nonfinite_statistics(skip):
    """A finite update whose batch made the normalization statistics inf/NaN (one inf
    observation): neither the params nor the statistics are taken."""

    def update(state, trajs, keys):
        return FakeState({"w": state.params["w"] + 1}), keys, {"finite": True, "loss": 0.5}

    def normalize_fn(normalizer, trajs, behaviour):
        poisoned = normalizer._replace(returns=RunningStats(np.inf, np.nan, 1.0))
        return poisoned, trajs, False

    lifetime = Lifetime()
    pipeline = Pipeline(1, capacity=2, max_policy_lag=1, lifetime=lifetime)
    publisher = LocalPublisher()
    first = Normalizer(obs=None, returns=RunningStats(0.0, 1.0, 1e-4), tracker=None)
    learner = Learner(
        LearnerSettings(2, steps_per_update=10, skip_nonfinite=skip, max_skipped=1),
        FakeState({"w": np.zeros(())}),
        np.zeros(2),
        update,
        pipeline,
        publisher,
        Metrics(),
        lifetime,
        normalizer=first,
        normalize_fn=normalize_fn,
    )
    pipeline.put(stamped(0, 0, 0))
    if skip:
        learner.step()
        assert learner.skipped == 1 and learner.version == 1
    else:
        with pytest.raises(
            NonFiniteUpdate, match="non-finite observation or return statistics after update 1"
        ):
            learner.step()
        assert publisher.latest_version == 0
    assert learner.normalizer is first and learner.state.params["w"] == 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_learner_advances_its_keys_between_updates():
    """Each update draws fresh keys (minibatch shuffles differ), with the real sharded update."""
    cfg = TrainConfig(
        env=EnvConfig(id="CartPole-v1", num_envs=B),
        network=NetworkConfig(hidden_sizes=(8,)),
        ppo=PPOConfig(num_epochs=1, num_minibatches=2),
        layout=LayoutConfig(actors_per_device=1),
        rollout_length=T,
        total_steps=T * B * 10,
    )
    sharded = sharded_update(cfg, jax.devices()[:2], 1)
    used = []

    def recording(state, trajs, keys):
        used.append(np.asarray(jax.device_get(keys)))
        return sharded.update(state, trajs, keys)

    learner, pipeline, _ = fake_learner(
        recording, state=sharded.state, keys=env_keys(jax.random.PRNGKey(1), 1, B, sharded.mesh)
    )
    traj = sharded.placement.place(
        jax.device_put(
            trajectories.actor_trajectory(np.random.default_rng(0), sharded.spec),
            jax.devices()[0],
        )
    )
    for seq in range(3):
        pipeline.put(stamped(0, seq, max(seq - 1, 0), traj=traj))
    learner.run()
    assert len(used) == 3
    for i in range(3):
        for j in range(i):
            assert not (used[i] == used[j]).any(), (i, j)


@pytest.mark.timeout(60)
def test_learner_skips_nonfinite_updates_up_to_the_limit():
    finite = iter([False, True, False])

    def update(state, trajs, keys):
        return FakeState({"w": state.params["w"] + 1}), keys, {"finite": next(finite), "loss": 0.5}

    learner, pipeline, publisher = fake_learner(update, skip=True, max_skipped=1)
    for seq in range(3):
        pipeline.put(stamped(0, seq, max(seq - 1, 0)))
    learner.step()  # skipped: the old params go out under the next version
    assert learner.skipped == 1 and learner.version == 1 and learner.state.params["w"] == 0
    assert learner.metrics.total("learner/skipped_nonfinite") == 1
    learner.step()
    assert learner.version == 2 and learner.state.params["w"] == 1
    with pytest.raises(TooManySkippedUpdates, match="2 of 3 updates skipped"):
        learner.step()
    assert learner.skipped == 2 and publisher.latest_version == 2


@pytest.mark.timeout(60)
def test_learner_blocks_on_new_params_before_publishing(monkeypatch):
    events = []

    class Recording(LocalPublisher):
        def publish(self, params, **kwargs):
            events.append(("publish", params["w"]))
            return super().publish(params, **kwargs)

    def update(state, trajs, keys):
        return (
            FakeState({"w": np.asarray(state.params["w"] + 1)}),
            keys,
            {"finite": True, "loss": 0.5},
        )

    real = jax.block_until_ready

    def block(x):
        if isinstance(x, dict) and "w" in x:
            events.append(("block", x["w"]))
        return real(x)

    learner, pipeline, _ = fake_learner(update, updates=1, publisher=Recording())
    monkeypatch.setattr(jax, "block_until_ready", block)
    pipeline.put(stamped(0, 0, 0))
    learner.run()
    assert events == [("publish", 0), ("block", 1), ("publish", 1)]


@pytest.mark.timeout(60)
def test_learner_metrics_cover_every_actor_and_the_max_lag():
    def update(state, trajs, keys):
        return state, keys, {"finite": True, "loss": 0.5}

    learner, pipeline, _ = fake_learner(update, actors=2)
    for seq, version in enumerate([0, 0, 2]):  # lags 0, 1, 0
        for actor in (0, 1):
            pipeline.put(stamped(actor, seq, version))
    learner.run()
    m = learner.metrics
    assert m.total("episodes") == 6 and m.total("env_steps") == 30
    assert m.last("lag/max_seen") == 1
    assert m.last("version") == 3


@pytest.mark.timeout(60)
def test_learner_passes_each_update_the_keys_the_last_one_returned():
    passed = []

    def update(state, trajs, keys):
        passed.append(int(keys[0]))
        return state, keys + 1, {"finite": True, "loss": 0.5}

    learner, pipeline, _ = fake_learner(update)
    for seq in range(3):
        pipeline.put(stamped(0, seq, max(seq - 1, 0)))
    learner.run()
    assert passed == [0, 1, 2] and int(learner.keys[0]) == 3
