"""A population on Ray, on a tiny budget: each member's actor is a Ray worker of one shared
private Ray; members exploit through their Ray publishers, a member's SIGKILLed worker is
restarted while the population goes on, and a stopped population resumes whole. Every
test starts its own local Ray and leaves no process of it behind."""

import os
import signal
import subprocess
import threading

import pytest

from podrace.control import ComponentError, Lifetime
from podrace.envs import EnvSource
from podrace.runtime.population import prepare_population
from podrace.runtime.ray.processes import process_tree
from podrace.runtime.run import prepare
from tests.helpers.cli import podrace_command, run_flags
from tests.helpers.populations import (
    POPULATION_RUN_MARKS,
    RAY_MEMBER_SPU,
    RAY_POPULATION_FLAGS,
    lineage,
    small_ray_population,
    stop_then_resume_population,
)
from tests.helpers.runs import metric_lines
from tests.runtime import ray_helpers
from tests.waiting import wait_until

ray = pytest.importorskip("ray")

pytestmark = POPULATION_RUN_MARKS


@pytest.mark.parametrize("data_order", ["fixed", "elastic"])
def test_ray_members_exploit_and_go_on_through_a_killed_worker(tmp_path, data_order):
    cfg = small_ray_population(
        tmp_path, total_steps=16 * RAY_MEMBER_SPU, **{"ray.data_order": data_order}
    )
    lifetime = Lifetime()
    population = prepare_population(cfg, lifetime, None, None, None, prepare)
    temp_dir = population.ray.driver.connection.temp_dir
    victim_run = population.members[1].run
    (victim,) = victim_run.fleet.worker_pids()
    pids = [pid for m in population.members for pid in m.run.fleet.worker_pids()]
    killed = threading.Event()

    def kill_mid_run() -> None:
        wait_until(lambda: victim_run.learner.version >= 4 or lifetime.stopping, 300)
        if not lifetime.stopping:
            os.kill(victim, signal.SIGKILL)
            killed.set()

    threading.Thread(target=kill_mid_run, daemon=True).start()
    result = population.run()
    assert killed.is_set()
    root = result.run_dir
    assert [m.updates for m in result.members] == [16, 16]
    assert [m.topology for m in result.members] == ["ray", "ray"]
    assert [m.ray.restarts for m in result.members] == [0, 1]
    lines = lineage(root)
    assert lines, "no member exploited the other"
    for member in (0, 1):
        member_lines = metric_lines(root / f"member-{member}")
        last = member_lines[-1]
        assert last["version"] == 16 and last["env_steps"] == 16 * RAY_MEMBER_SPU
        assert last["pbt/exploits"] == len([x for x in lines if x["member"] == member])
        # Rollouts of a policy an exploit replaced were taken within the lag bound.
        assert last["lag/max_seen"] <= cfg.max_policy_lag
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert (root / "ray-logs").is_dir()  # the population's one local Ray's logs, kept
    assert not process_tree(temp_dir) and not ray.is_initialized()


def test_a_member_whose_workers_keep_failing_stops_the_population_and_leaves_no_ray(tmp_path):
    cfg = small_ray_population(tmp_path, **{"ray.max_restarts": 0})
    envs = EnvSource(cfg.env, ray_helpers.raising_env)
    population = prepare_population(cfg, Lifetime(), envs, None, None, prepare)
    temp_dir = population.ray.driver.connection.temp_dir
    with pytest.raises(ComponentError) as caught:
        population.run()
    message = str(caught.value)
    assert caught.value.component in ("member-0 ray-worker-0", "member-1 ray-worker-0"), message
    assert "EnvExploded: boom" in message and "\n" not in message
    assert not process_tree(temp_dir) and not ray.is_initialized()


def test_a_stopped_ray_population_resumes_every_member_and_its_lineage(tmp_path):
    root, _ = stop_then_resume_population(tmp_path, RAY_POPULATION_FLAGS, RAY_MEMBER_SPU)
    for m in (0, 1):
        assert "ray/restarts" in metric_lines(root / f"member-{m}")[-1]


def test_a_ray_population_goes_on_through_a_lost_node(tmp_path):
    """Both members' workers pinned to the second node of a cluster the population joins
    (elastic order); SIGKILL that node's raylet once both trained 4 updates and start a
    third node: every member's lost worker restarts there, both reach their last update,
    and the joined cluster keeps running without any worker of the population."""
    total = 16 * RAY_MEMBER_SPU
    with ray_helpers.two_node_cluster() as cluster:
        command = podrace_command(
            "train",
            "cartpole-ppo",
            *run_flags(tmp_path, total),
            *RAY_POPULATION_FLAGS,
            *("--ray.address", cluster.address, "--ray.worker-resources", "actor_node=1"),
            *("--ray.data-order", "elastic", "--ray.no-workers-timeout-s", "400"),
        )
        proc = subprocess.Popen(
            command, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        root = tmp_path / "r"
        try:
            wait_until(lambda: _all_at(root, 4) or proc.poll() is not None, timeout=400)
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            os.kill(ray_helpers.raylet_pid(cluster.temp_dir, b"actor_node"), signal.SIGKILL)
            ray_helpers.start_node(
                cluster.address, cluster.temp_dir, '{"actor_node": 2}', 2, cluster.env
            )
            _, err = proc.communicate(timeout=500)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err[-3000:]
        for member in (0, 1):
            last = metric_lines(root / f"member-{member}")[-1]
            assert last["version"] == 16 and last["env_steps"] == total
            assert last["ray/restarts"] >= 1, last
        tree = process_tree(cluster.temp_dir)
        assert tree, "the population stopped a cluster it only joined"
        titles = [_cmdline(pid) for pid in tree]
        assert not [t for t in titles if t.startswith(b"ray::RolloutWorker")], titles


def _all_at(root, version: int) -> bool:
    return all(
        any(line.get("version", 0) >= version for line in metric_lines(root / f"member-{m}"))
        for m in (0, 1)
    )


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""
