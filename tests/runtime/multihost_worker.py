"""One process of the learner-equivalence check (run by tests/runtime/test_multihost.py).

    python -m tests.runtime.multihost_worker OUT.npz PROCESS NUM_PROCESSES COORDINATOR

Joins the run, builds the global learner mesh (one learner device per process), feeds its
own actors' slices of the same random batches the single-process reference uses, runs
UPDATES learner updates, and (process 0) saves the params.
"""

from __future__ import annotations

import os
import sys

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from podrace.config import EnvConfig, LayoutConfig, NetworkConfig, PPOConfig, TrainConfig, replace
from podrace.envs import env_spec
from podrace.learner import (
    LearnerPlacement,
    env_keys,
    make_algorithm,
    make_mesh,
    make_update_fn,
    trajectory_shardings,
)
from podrace.networks import make_network
from podrace.types import Trajectory

T, B, GLOBAL_ACTORS, UPDATES = 8, 8, 4, 3


def config(num_processes: int) -> TrainConfig:
    cfg = TrainConfig(
        env=EnvConfig(id="CartPole-v1", num_envs=B),
        network=NetworkConfig(hidden_sizes=(16, 16)),
        ppo=PPOConfig(num_epochs=2, num_minibatches=4),
        layout=LayoutConfig(actors_per_device=GLOBAL_ACTORS // num_processes),
        rollout_length=T,
        total_steps=T * B * GLOBAL_ACTORS * 10,
    )
    return replace(cfg, **{"distributed.num_processes": num_processes, "distributed.process_id": 0})


def batch(update: int, spec) -> list[Trajectory]:
    """The rollouts of every global actor for one update (the same in every process)."""
    rng = np.random.default_rng(update)
    out = []
    for _ in range(GLOBAL_ACTORS):
        obs = rng.normal(size=(T, B) + spec.obs_shape).astype(np.float32)
        out.append(
            Trajectory(
                obs=obs,
                actions=rng.integers(0, spec.num_actions, size=(T, B)).astype(np.int32),
                logprobs=np.log(rng.uniform(0.3, 0.7, size=(T, B))).astype(np.float32),
                values=rng.normal(size=(T, B)).astype(np.float32),
                rewards=rng.normal(size=(T, B)).astype(np.float32),
                terminated=rng.uniform(size=(T, B)) < 0.1,
                truncated=rng.uniform(size=(T, B)) < 0.05,
                valid=rng.uniform(size=(T, B)) < 0.9,
                last_obs=obs[-1],
                last_value=rng.normal(size=(B,)).astype(np.float32),
            )
        )
    return out


def train(learner_devices, num_processes: int, process: int) -> dict:
    """UPDATES updates over a mesh of `learner_devices`; returns this process's params copy."""
    cfg = config(num_processes)
    spec = env_spec(cfg.env)
    network = make_network(cfg.network, spec)
    mesh = make_mesh(learner_devices)
    replicated = NamedSharding(mesh, P())
    params = jax.jit(network.init, out_shardings=replicated)(jax.random.PRNGKey(0), np.zeros((1, 4), np.float32))
    algo = make_algorithm(cfg, network.apply)
    state = jax.jit(algo.init, out_shardings=replicated)(params)
    keys = env_keys(jax.random.PRNGKey(1), cfg.num_actors, B, mesh)
    placement = LearnerPlacement(*trajectory_shardings(mesh))
    update = make_update_fn(algo, mesh, cfg.num_actors)
    local = jax.local_devices()[0]
    for u in range(UPDATES):
        mine = batch(u, spec)[process * cfg.num_actors : (process + 1) * cfg.num_actors]
        trajs = tuple(placement.place(jax.device_put(t, local)) for t in mine)
        state, keys, _ = update(state, trajs, keys)
    from podrace.runtime.distributed import local_copy

    return jax.device_get(local_copy(state.params))


def main(out: str, process: int, num_processes: int, coordinator: str) -> None:
    from podrace.config import DistributedConfig
    from podrace.runtime.distributed import global_learner_devices, join

    join(DistributedConfig(coordinator, num_processes, process, init_timeout_s=60))
    params = train(global_learner_devices((0,), "cpu"), num_processes, process)
    leaves = {str(i): np.asarray(x) for i, x in enumerate(jax.tree.leaves(params))}
    np.savez(f"{out}.{process}.npz", **leaves)
    jax.distributed.shutdown()


def faulty_run(run_dir: str, process: int, num_processes: int, coordinator: str) -> int:
    """`podrace train` (the CLI, in this process) whose process 1 has an env that raises."""
    from podrace.cli import main as cli
    from podrace.runtime import faults, multi_host

    prepare = multi_host.prepare

    def prepare_with_fault(cfg, lifetime=None):
        run = prepare(cfg, lifetime)
        if process == 1:
            faults.inject(run.local, faults.FaultPlan(env_raise=(0, 200)))
        return run

    multi_host.prepare = prepare_with_fault
    return cli([
        "train", "cartpole-ppo", "--total-steps", str(10**8), "--log.run-dir", run_dir, "--log.run-name", "r",
        "--log.console", "none", "--distributed.coordinator", coordinator,
        "--distributed.num-processes", str(num_processes), "--distributed.process-id", str(process),
        "--distributed.init-timeout-s", "60",
    ])


if __name__ == "__main__":
    # Before JAX creates its backend (importing jax does not); tests import this module too.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=1").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if sys.argv[1] == "fault":
        code = faulty_run(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
