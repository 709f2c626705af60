"""JAX envs through the other topologies: Ray workers (each its envs on its own device,
in its compiled rollout) and two processes of one jax.distributed run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from podrace.config import replace
from podrace.presets import PRESETS
from podrace.runtime.run import train
from tests.xla_flags import without_device_count

ROOT = Path(__file__).resolve().parents[2]
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


def run_processes(commands: list[list[str]], timeout: float) -> list[tuple[int, str]]:
    """Run `commands` together, each in its own process group (killed if still running)."""
    environ = without_device_count(os.environ)  # each process forces its own device count
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environ.get("PYTHONPATH")]))
    environ["JAX_PLATFORMS"] = "cpu"
    procs = [
        subprocess.Popen(
            command,
            cwd=ROOT,
            env=environ,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for command in commands
    ]
    try:
        return [(proc.wait(timeout=timeout), proc.stderr.read()) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            proc.stderr.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_processes_of_one_distributed_run_step_jax_envs(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    commands = [
        [
            sys.executable,
            "-m",
            "podrace.cli",
            "train",
            "cartpole-ppo",
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
            "--distributed.coordinator",
            f"127.0.0.1:{port}",
            "--distributed.num-processes",
            "2",
            "--distributed.process-id",
            str(process),
            "--distributed.init-timeout-s",
            "60",
            "--log.console",
            "none",
            "--log.run-dir",
            str(tmp_path / "runs"),
        ]
        for process in range(2)
    ]
    for code, err in run_processes(commands, timeout=240):
        assert code == 0, err[-3000:]
