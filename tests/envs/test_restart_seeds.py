"""Every restart of an env worker (a process, or an env-only Ray worker) seeds its envs
apart from the original's and from every earlier restart's: a restarted worker plays new
episodes, never ones it or its actor's other workers played before.

The workers' processes are not started: what a worker builds is the `WorkerSpec` it is
started with (its envs are `spec.source.make_part(spec.num_envs, spec.seed, spec.part)`),
so the test records the spec of each start."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from podrace.config import EnvConfig
from podrace.envs import EnvSource
from podrace.envs.base import env_seeds
from podrace.envs.worker_protocol import WorkerSpec
from podrace.envs.workers import EnvWorker, split_envs

pytestmark = pytest.mark.timeout(60)

RESTARTS = 6


def env_seeds_of(spec: WorkerSpec) -> set[int]:
    """The seeds of the envs a worker builds from `spec`: through a backend, each env gets
    its seed in the whole of the actor's envs; a factory is called with one seed derived
    from the spec's seed and the part (tagged apart from the backend's)."""
    part = spec.part
    through_backend = env_seeds(spec.seed, spec.num_envs)[part.start : part.stop]
    through_factory = np.random.SeedSequence([spec.seed, part.start]).generate_state(1)[0]
    return {("env", s) for s in through_backend} | {("factory", int(through_factory) & 0x7FFFFFFF)}


def process_link(name, source, spec, num_envs, seed, part):
    return EnvWorker(name, source, spec, num_envs, seed, part)


def ray_link(name, source, spec, num_envs, seed, part):
    from podrace.runtime.ray.served import RayEnvLink

    worker = WorkerSpec(source, num_envs, seed, part, None, spec)
    return RayEnvLink(name, worker, remote=None, options={})


@pytest.mark.parametrize(
    "make_link",
    [
        process_link,
        pytest.param(
            ray_link,
            marks=pytest.mark.skipif(not importlib.util.find_spec("ray"), reason="no ray"),
        ),
    ],
    ids=["process", "ray"],
)
def test_every_restart_gets_seeds_apart_from_the_original_and_every_earlier_restart(make_link):
    source = EnvSource(EnvConfig(id="CartPole-v1"))
    spec = source.spec()
    num_envs, seed = 8, 123
    started: dict[tuple[int, int], WorkerSpec] = {}
    links = []
    try:
        for index, part in enumerate(split_envs(num_envs, 2)):  # one actor's two workers
            link = make_link(f"env.w{index}", source, spec, num_envs, seed, part)
            links.append(link)

            def record(link=link, index=index) -> None:
                started[index, link.restarts] = link._worker_spec

            link.start = record  # the spec it would start a process (or Ray actor) with
            link.start()
            for _ in range(RESTARTS):
                link.restart()
    finally:
        for link in links:
            link.close()
    assert sorted(started) == [(w, r) for w in range(2) for r in range(RESTARTS + 1)]
    seen: dict[object, tuple[int, int]] = {}
    for incarnation, worker_spec in started.items():
        assert worker_spec.part == split_envs(num_envs, 2)[incarnation[0]]
        for env in env_seeds_of(worker_spec):
            assert env not in seen, f"{incarnation} reuses a seed of {seen[env]}"
            seen[env] = incarnation
