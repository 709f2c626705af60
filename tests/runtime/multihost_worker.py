"""One process of the learner-equivalence check (run by tests/runtime/test_multihost.py).

    python -m tests.runtime.multihost_worker OUT.npz PROCESS NUM_PROCESSES COORDINATOR [normalize]

Joins the run, builds the learner as the runtimes do over the global learner mesh (one
learner device per process), feeds its own actors' slices of the same random batches the
single-process reference uses, runs UPDATES learner updates (with `normalize`, each batch
normalized first: observation and return statistics), and saves the params (and the
normalizer's statistics).
"""

from __future__ import annotations

import os
import sys
import time

import jax
import numpy as np

from podrace.config import (
    EnvConfig,
    LayoutConfig,
    NetworkConfig,
    NormalizeConfig,
    PPOConfig,
    TrainConfig,
    replace,
)
from podrace.control import Lifetime
from podrace.envs import env_spec
from podrace.metrics.registry import Metrics
from podrace.networks import make_network
from podrace.pipeline import Pipeline
from podrace.runtime.build import build_learner, seed_key
from podrace.runtime.faults import FaultPlan
from podrace.sync.local import LocalPublisher
from podrace.types import Trajectory
from tests.trajectories import random_trajectory

T, B, GLOBAL_ACTORS, UPDATES = 8, 8, 4, 3


def config(num_processes: int, normalize: bool = False) -> TrainConfig:
    cfg = TrainConfig(
        env=EnvConfig(id="CartPole-v1", num_envs=B),
        network=NetworkConfig(hidden_sizes=(16, 16)),
        normalize=NormalizeConfig(obs=normalize, reward=normalize),
        ppo=PPOConfig(num_epochs=2, num_minibatches=4),
        layout=LayoutConfig(actors_per_device=GLOBAL_ACTORS // num_processes),
        rollout_length=T,
        total_steps=T * B * GLOBAL_ACTORS * 10,
    )
    return replace(cfg, **{"distributed.num_processes": num_processes, "distributed.process_id": 0})


def batch(update: int, spec) -> list[Trajectory]:
    """The rollouts of every global actor for one update (the same in every process)."""
    rng = np.random.default_rng(update)
    return [random_trajectory(rng, spec, T, B) for _ in range(GLOBAL_ACTORS)]


def train(learner_devices, num_processes: int, process: int, normalize: bool = False) -> dict:
    """UPDATES updates over a mesh of `learner_devices`; returns this process's copy of the
    params (and, normalizing, of the observation and return statistics)."""
    from podrace.sync.placement import local_copy

    cfg = config(num_processes, normalize)
    spec = env_spec(cfg.env)
    lifetime = Lifetime()
    learner, placement = build_learner(
        cfg,
        spec,
        make_network(cfg.network, spec),
        learner_devices,
        Pipeline(cfg.num_actors, 1, 1, lifetime),
        LocalPublisher(),
        Metrics(),
        lifetime,
    )
    local_copy(learner.acting_params())  # what the runtimes give their actors and evaluator
    state, keys, normalizer = learner.state, learner.keys, learner.normalizer
    local = jax.local_devices()[0]
    for u in range(UPDATES):
        mine = batch(u, spec)[process * cfg.num_actors : (process + 1) * cfg.num_actors]
        trajs = tuple(placement.place(jax.device_put(t, local)) for t in mine)
        if normalize:  # every rollout acted with the statistics of the update before
            normalizer, trajs, _ = learner.normalize_fn(
                normalizer, trajs, (normalizer.obs,) * cfg.num_actors
            )
        state, keys, _ = learner.update_fn(state, trajs, keys)
    out = {"params": state.params}
    if normalize:
        out["stats"] = (normalizer.obs, normalizer.returns)
    return jax.device_get(local_copy(out))


def initial_params(normalize: bool = False) -> dict:
    """The params the learner starts from (as `build_learner` initializes them)."""
    cfg = config(1, normalize)
    network = make_network(cfg.network, env_spec(cfg.env))
    return network.init(seed_key(cfg.seed, 0), np.zeros((1, 4), np.float32))


def main(out: str, process: int, num_processes: int, coordinator: str, normalize: bool) -> None:
    from podrace.config import DistributedConfig
    from podrace.runtime.multihost.distributed import global_learner_devices, join

    join(DistributedConfig(coordinator, num_processes, process, init_timeout_s=60))
    params = train(global_learner_devices((0,), "cpu"), num_processes, process, normalize)
    leaves = {str(i): np.asarray(x) for i, x in enumerate(jax.tree.leaves(params))}
    np.savez(f"{out}.{process}.npz", **leaves)
    jax.distributed.shutdown()


FAULTS = {
    # process 1's env raises; process 0 also makes the run directory late: process 1 must
    # wait for it before making its part inside (or process 0 finds the directory taken)
    "fault": (1, FaultPlan(env_raise=(0, 200))),
    # process 0's env steps take 2 s: no update happens for a while once training runs
    "slow": (0, FaultPlan(slow={"env_step": 2.0})),
}


def faulty_run(
    run_dir: str, process: int, num_processes: int, coordinator: str, fault: str = "fault"
) -> int:
    """`podrace train` (the CLI, in this process) with one of `FAULTS` injected."""
    from podrace.cli import main as cli
    from podrace.runtime import run as runs
    from podrace.runtime.multihost import group

    prepare, create_run_dir = runs.prepare, group.create_run_dir

    def create_run_dir_late(cfg):
        time.sleep(1.0)  # a slow file system: simulated work
        return create_run_dir(cfg)

    group.create_run_dir = create_run_dir_late

    faulty_process, plan = FAULTS[fault]

    def prepare_with_fault(*args, **kwargs):
        kwargs["faults"] = plan if process == faulty_process else None
        return prepare(*args, **kwargs)

    runs.prepare = prepare_with_fault
    return cli(
        [
            "train",
            "cartpole-ppo",
            "--total-steps",
            str(10**8),
            "--log.run-dir",
            run_dir,
            "--log.run-name",
            "r",
            "--log.console",
            "none",
            "--distributed.coordinator",
            coordinator,
            "--distributed.num-processes",
            str(num_processes),
            "--distributed.process-id",
            str(process),
            "--distributed.init-timeout-s",
            "60",
        ]
    )


if __name__ == "__main__":
    # Before JAX creates its backend (importing jax does not); tests import this module too.
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=1"
    ).strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if sys.argv[1] in FAULTS:
        code = faulty_run(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[1])
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)
    main(
        sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:] == ["normalize"]
    )
