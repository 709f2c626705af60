"""The factories every topology calls: seeds and keys derive from (run seed, stream, id); the
learner's programs are compiled with the options its network and devices call for."""

import re

import jax
import numpy as np
import pytest

from podrace.config import NetworkConfig, TrainConfig
from podrace.control import Control, Heartbeat, Lifetime
from podrace.runtime import build


class FakeEnv:
    num_envs = 2

    def __init__(self, seed):
        self.seed = seed


@pytest.fixture
def made_envs(monkeypatch):
    seeds = []

    class FakeSource:
        """Stands in for the EnvSource the factories build envs through."""

        def make(self, num_envs, seed, threads=None):
            seeds.append(seed)
            return FakeEnv(seed)

    monkeypatch.setattr(build, "EnvSource", lambda env_cfg, factory=None: FakeSource())
    return seeds


def actor(cfg, actor_id):
    control = Control(Lifetime(), Heartbeat(f"actor-{actor_id}"), lambda metrics: None)
    return build.build_actor(
        cfg, actor_id, policy=_Policy(), params=None, out=None, control=control
    )


class _Policy:
    device = None


@pytest.mark.timeout(60)
def test_every_actor_gets_its_own_env_seed_and_policy_key(made_envs):
    cfg = TrainConfig()
    actors = [actor(cfg, i) for i in range(3)]
    assert len(set(made_envs)) == 3
    keys = {tuple(np.asarray(a.key).ravel().tolist()) for a in actors}
    assert len(keys) == 3
    # Reproducible: the same run seed and actor id give the same seed and key.
    again = actor(cfg, 1)
    assert made_envs[-1] == made_envs[1]
    np.testing.assert_array_equal(np.asarray(again.key), np.asarray(actors[1].key))


@pytest.mark.timeout(60)
def test_the_evaluator_envs_are_seeded_apart_from_every_actor(made_envs):
    cfg = TrainConfig()
    for i in range(2):
        actor(cfg, i)
    control = Control(Lifetime(), Heartbeat("evaluator"), lambda metrics: None)
    from podrace.metrics.registry import Metrics

    build.build_evaluator(
        cfg, greedy=None, device=None, params=None, metrics=Metrics(), control=control
    )
    assert len(set(made_envs)) == 3


@pytest.mark.timeout(60)
def test_seeds_change_with_the_run_seed(made_envs):
    from podrace.config import replace

    actor(TrainConfig(), 0)
    actor(replace(TrainConfig(), seed=TrainConfig().seed + 1), 0)
    assert made_envs[0] != made_envs[1]


@pytest.mark.timeout(60)
def test_envpool_threads_share_the_cores_after_one_for_the_learner(monkeypatch):
    import os

    from podrace.config import replace
    from podrace.envs import EnvSource

    cfg = TrainConfig()
    for cores, actors, expected in ((2, 1, 1), (2, 2, 1), (1, 1, 1), (16, 2, 7), (16, 1, 15)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)))
        assert (
            build.env_threads(replace(cfg, **{"layout.actors_per_device": actors})) == expected
        ), (cores, actors)
    assert build.env_threads(replace(cfg, **{"env.num_threads": 3})) == 3  # the user's count wins
    assert build.env_threads(replace(cfg, runtime="ray")) is None  # Ray workers: envpool's default
    for source, threads, expected in (
        (EnvSource(cfg.env), 1, 1),
        (EnvSource(replace(cfg, **{"env.num_threads": 2}).env), 1, 2),
    ):
        env = source.make(4, 0, threads)
        try:
            assert env._env.config["num_threads"] == expected
        finally:
            env.close()


def built_learner(network: NetworkConfig, normalize: bool = False):
    """A CartPole learner as `build_learner` makes it, and a placed dummy rollout."""
    from podrace.config import EnvConfig, LayoutConfig, NormalizeConfig, PPOConfig, replace
    from podrace.envs import env_spec
    from podrace.metrics.registry import Metrics
    from podrace.networks import make_network
    from podrace.pipeline import Pipeline
    from podrace.sync.local import LocalPublisher

    cfg = TrainConfig(
        env=EnvConfig(id="CartPole-v1", num_envs=4),
        network=network,
        rollout_length=4,
        total_steps=64,
        ppo=PPOConfig(num_epochs=1, num_minibatches=2),
        layout=LayoutConfig(actors_per_device=1),
    )
    if normalize:
        cfg = replace(cfg, normalize=NormalizeConfig(obs=True, reward=True))
    spec = env_spec(cfg.env)
    lifetime = Lifetime()
    learner, placement = build.build_learner(
        cfg,
        spec,
        make_network(cfg.network, spec),
        jax.devices()[:1],
        Pipeline(1, 1, 1, lifetime),
        LocalPublisher(),
        Metrics(),
        lifetime,
    )
    return learner, (placement.place(build.dummy_trajectory(cfg, spec, jax.devices()[0])),)


def schedule(jitted, *args, **options) -> str:
    """The compiled program's computations with `options` added: their instructions in the
    order they run, without the source locations (an executable JAX's persistent cache
    returns may have been compiled from the same program traced elsewhere)."""
    lines = jitted.lower(*args).compile(options or None).as_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(("%", "ENTRY")))
    return re.sub(r", metadata=\{[^}]*\}", "", "\n".join(lines[first:]))


DEFAULT_SCHEDULE = {"xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_DEFAULT"}
MEMORY_SCHEDULE = {"xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"}


@pytest.mark.timeout(120)
def test_an_mlp_learner_on_cpu_compiles_its_programs_with_the_memory_optimized_schedule():
    # The learner's own programs, as the runtimes build them: the update and (normalizing)
    # the batch preparation are scheduled as with the option given explicitly, and not as
    # XLA's default would schedule them.
    learner, trajs = built_learner(NetworkConfig(hidden_sizes=(16, 16)), normalize=True)
    update_args = (learner.state, trajs, learner.keys)
    built = schedule(learner.update_fn.jitted, *update_args)
    assert built == schedule(learner.update_fn.jitted, *update_args, **MEMORY_SCHEDULE), (
        "update not memory-scheduled"
    )
    assert built != schedule(learner.update_fn.jitted, *update_args, **DEFAULT_SCHEDULE), (
        "the option changes nothing"
    )
    behaviour = (learner.normalizer.obs,)
    normalize_args = (learner.normalizer, trajs, behaviour)
    built = schedule(learner.normalize_fn, *normalize_args)
    assert built == schedule(learner.normalize_fn, *normalize_args, **MEMORY_SCHEDULE), (
        "normalization not memory-scheduled"
    )


@pytest.mark.timeout(120)
def test_the_memory_optimized_schedule_changes_no_value():
    # Only the order of the update's ops changes: five updates give the same params, bit for bit.
    learner, trajs = built_learner(NetworkConfig(hidden_sizes=(16, 16)))
    jitted = learner.update_fn.jitted
    args = (learner.state, trajs, learner.keys)
    results = []
    for options in (MEMORY_SCHEDULE, DEFAULT_SCHEDULE):
        update = jitted.lower(*args).compile(options)
        state, _, keys = args
        for _ in range(5):
            state, keys, _ = update(state, trajs, keys)
        results.append(jax.tree.leaves(jax.device_get(state)))
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_only_mlp_learners_on_cpu_change_the_schedule(monkeypatch):
    from types import SimpleNamespace

    from podrace.learner_mesh import learner_compiler_options

    def mesh(platform):
        return SimpleNamespace(devices=np.array([SimpleNamespace(platform=platform)]))

    assert learner_compiler_options(NetworkConfig(torso="mlp"), mesh("cpu")) == MEMORY_SCHEDULE
    assert (
        learner_compiler_options(NetworkConfig(hidden_sizes=(128, 32)), mesh("cpu"))
        == MEMORY_SCHEDULE
    )
    # Wider layers and convolutional updates gain from XLA:CPU's concurrency; accelerators
    # keep their defaults.
    assert learner_compiler_options(NetworkConfig(hidden_sizes=(64, 256)), mesh("cpu")) is None
    assert learner_compiler_options(NetworkConfig(torso="nature_cnn"), mesh("cpu")) is None
    assert learner_compiler_options(NetworkConfig(torso="impala_resnet"), mesh("cpu")) is None
    assert learner_compiler_options(NetworkConfig(torso="mlp"), mesh("gpu")) is None
    # A scheduler the user chose in XLA_FLAGS is left to apply.
    for flag in (
        "--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_DEFAULT",
        "--xla_cpu_enable_concurrency_optimized_scheduler=false",
    ):
        monkeypatch.setenv("XLA_FLAGS", f"--xla_force_host_platform_device_count=2 {flag}")
        assert learner_compiler_options(NetworkConfig(torso="mlp"), mesh("cpu")) is None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_envs,episodes,made", [(8, 16, 8), (16, 2, 2), (2**31 - 1, 16, 16)])
def test_the_evaluator_makes_no_more_envs_than_it_counts_episodes(
    monkeypatch, num_envs, episodes, made
):
    """--eval.num-envs 2147483647 must not try to build that many envs, and --eval.episodes 2
    with the preset's 16 envs must not play 14 envs' uncounted episodes."""
    from podrace.config import replace
    from podrace.metrics.registry import Metrics

    asked = []

    class CountingSource:
        def make(self, n, seed, threads=None):
            asked.append(n)
            return FakeEnv(seed)

    monkeypatch.setattr(build, "EnvSource", lambda env_cfg, factory=None: CountingSource())
    cfg = replace(TrainConfig(), **{"eval.num_envs": num_envs, "eval.episodes": episodes})
    control = Control(Lifetime(), Heartbeat("evaluator"), lambda metrics: None)
    build.build_evaluator(
        cfg, greedy=None, device=None, params=None, metrics=Metrics(), control=control
    )
    assert asked == [made]
