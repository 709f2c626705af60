"""Regressions found by attacking the fused rollout (attack3 branch)."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podrace.control import Heartbeat


def test_heartbeat_allows_each_step_of_a_multi_step_call_the_timeout():
    """A fused rollout is one watched call of T env steps: the watchdog's per-step timeout
    must not fail a rollout whose steps are each well within it."""
    beat = Heartbeat("actor-0")
    beat.enter("env.rollout", 0, steps=512)
    now = time.monotonic()
    assert beat.overdue(now + 10.0, 2.0) is None  # 10s for 512 steps: 20ms a step
    assert "within 1024s" in beat.overdue(now + 2000.0, 2.0)
    beat.enter("env.step", 0)
    assert "within 2s" in beat.overdue(time.monotonic() + 3.0, 2.0)


def test_fused_and_host_episode_returns_agree_bit_for_bit():
    """Pendulum's float rewards: the host adapter's episode returns must equal those a
    fused rollout counts (in float32 on the device), not differ in the last digits."""
    pytest.importorskip("envpool")
    from podrace.config import EnvConfig
    from podrace.envs.envpool_backend import EnvpoolEnv
    from podrace.envs.episode_stats import count_step, zero_counts

    cfg = EnvConfig(id="Pendulum-v1", max_episode_steps=37)
    num_envs, steps = 3, 120
    actions = np.random.default_rng(0).uniform(-3, 3, (steps, num_envs, 1)).astype(np.float32)

    host = EnvpoolEnv(cfg, num_envs, seed=5)
    host.reset()
    host_returns = []
    for a in actions:
        step = host.step(a)
        host_returns.append(step.episode_return[step.episode_done])
    host.close()

    fused = EnvpoolEnv(cfg, num_envs, seed=5)
    obs = fused.reset()
    xla = fused.xla_step()

    @jax.jit
    def roll(handle, counts, actions):
        def body(state, action):
            handle, counts = state
            handle, step = xla(handle, action)
            counts, ret, _ = count_step(counts, step.raw_reward, step.terminated, step.truncated,
                                        step.episode_done, xp=jnp)
            return (handle, counts), (ret, step.episode_done)
        return jax.lax.scan(body, (handle, counts), actions)[1]

    rets, done = jax.device_get(roll(xla.handle, zero_counts(num_envs, np.float32, np.int32), actions))
    fused.close()
    del obs
    fused_returns = np.asarray(rets[done], np.float64)
    host_returns = np.concatenate(host_returns)
    assert len(host_returns) == 9
    np.testing.assert_array_equal(host_returns, fused_returns)


def test_sweep_orphans_kills_the_orphans_ray_but_not_a_users_log_viewer(tmp_path, monkeypatch):
    """sweep_orphans stops the processes of a dead driver's Ray, never a user's `tail -f`
    of its logs or a script that was given its path."""
    import os
    import subprocess
    import tempfile

    from podrace.runtime import ray_cluster

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    orphan = tmp_path / "podrace-ray-abcdefgh"
    (orphan / "logs").mkdir(parents=True)
    log = orphan / "logs" / "raylet.out"
    log.write_text("x\n")
    gone = subprocess.Popen(["true"])
    gone.wait()
    (orphan / "owner").write_text(f"{gone.pid} 1\n")
    viewer = subprocess.Popen(["tail", "-f", str(log)], stdout=subprocess.DEVNULL)
    script = subprocess.Popen(["bash", "-c", f"sleep 60; : {orphan}"])
    # a Ray agent as it looks after renaming itself, with its log open in the dir
    agent = subprocess.Popen(["bash", "-c", f'exec -a "ray::DashboardAgent" sleep 60 > {orphan}/logs/agent.out'])
    try:
        time.sleep(0.5)
        assert ray_cluster.sweep_orphans() == [str(orphan)]
        assert agent.wait(timeout=5) == -9
        assert viewer.poll() is None and script.poll() is None
        assert not orphan.exists()
    finally:
        for p in (viewer, script, agent):
            if p.poll() is None:
                os.kill(p.pid, 9)
                p.wait()
