"""JAX envs through the other topologies: Ray workers (each its envs on its own device,
in its compiled rollout) and two processes of one jax.distributed run."""

from __future__ import annotations

import pytest

from podrace.config import replace
from podrace.presets import PRESETS
from podrace.runtime.run import train
from tests.runtime.multihost_processes import both_processes, finish, free_port, processes

JAX_ENV = {"env.id": "gymnax:CartPole-v1", "env.backend": "jax"}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ray_workers_step_jax_envs(tmp_path):
    cfg = replace(
        PRESETS["cartpole-ppo"][1],
        **JAX_ENV,
        **{
            "runtime": "ray",
            "ray.num_workers": 2,
            "total_steps": 6 * 2 * 8 * 16,
            "rollout_length": 16,
            "env.num_envs": 8,
            "eval.every_updates": 0,
            "eval.episodes": 2,
            "eval.num_envs": 2,
            "log.console": "none",
            "log.run_dir": str(tmp_path),
        },
    )
    result = train(cfg)
    assert result.updates == 6 and result.env_steps == 6 * 2 * 8 * 16
    assert result.final_eval is not None and result.final_eval.mean_return > 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_processes_of_one_distributed_run_step_jax_envs(tmp_path):
    flags = (
        "--env.id",
        "gymnax:CartPole-v1",
        "--env.num-envs",
        "8",
        "--rollout-length",
        "16",
        "--total-steps",
        str(4 * 2 * 8 * 16),
        "--eval.every-updates",
        "0",
        "--eval.episodes",
        "2",
        "--eval.num-envs",
        "2",
        "--log.run-dir",
        str(tmp_path / "runs"),
    )
    with processes(both_processes(free_port(), *flags)) as procs:
        results = finish(procs, 240)
    for code, _, err in results:
        assert code == 0, err[-3000:]
