"""The Ray runtime end to end: learning, a killed worker, a crash loop, shutdown (a run
pinned to one node of two: tests/runtime/test_ray_elastic.py's node-loss drill).

Every test starts its own Ray (a private local one, or `ray start` processes) and leaves
no process of it behind; Ray's start-up takes seconds, so runs are
short and timeouts generous.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import podrace
from podrace.config import ConfigError, replace
from podrace.control import ComponentError
from podrace.envs import EnvSource
from podrace.presets import PRESETS
from podrace.runtime.ray.processes import process_tree
from tests.helpers.cli import run_podrace
from tests.helpers.configs import LEARNS, small_ray
from tests.helpers.runs import last_line, stop_after
from tests.runtime import ray_helpers
from tests.waiting import wait_until

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.filterwarnings("ignore:os.fork", "ignore::UserWarning")


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_two_ray_workers_learn_cartpole(tmp_path, fake_wandb):
    from podrace.runtime.run import prepare

    # the runtime's lines also reach every other sink: log.wandb is on, to a fake
    # The thread runtime's learning run and threshold (seed 1 evaluates 500 here too).
    cfg = small_ray(tmp_path, **LEARNS, **{"log.wandb": True})
    run = prepare(cfg)
    temp_dir, pids = run.cluster.connection.temp_dir, run.fleet.worker_pids()
    result = run.run()
    assert result.final_eval.mean_return >= 150, result.final_eval
    updates = cfg.num_updates
    line = last_line(result.run_dir)
    assert line["ray/worker-0/rollouts"] == line["ray/worker-1/rollouts"] == updates
    assert line["env_steps"] == updates * 2 * 8 * 32
    assert line["ray/restarts"] == 0 and line["lag/max_seen"] <= 1
    assert 0 <= result.ray.object_store_bytes < 64 << 20, (
        result.ray.object_store_bytes
    )  # bounded, no backlog
    ray_helpers.assert_consumed_once(result.ray.stamps, 2, updates)
    (wandb_run,) = fake_wandb.runs
    assert wandb_run.logged[-1]["final"] == 1 and wandb_run.finished
    assert wandb_run.logged[-1]["ray/worker-0/rollouts"] == updates
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert not process_tree(temp_dir) and not any(os.path.exists(f"/proc/{p}") for p in pids)
    assert not ray.is_initialized()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigkilled_worker_is_restarted_nothing_consumed_twice_and_told_in_podrace_lines(
    tmp_path, capfd, caplog
):
    """A worker SIGKILLed mid-run: restarted once, every (worker, seq) consumed once, and
    the console shows podrace's two lines, while Ray's report of the death goes to the run
    directory's ray.log (Ray's own logs to ray-logs/)."""
    import logging

    from podrace.runtime.run import prepare

    caplog.set_level(logging.INFO, logger="podrace")
    cfg = small_ray(tmp_path, total_steps=2 * 8 * 16 * 24)
    run = prepare(cfg)
    victim = run.fleet.worker_pids()[0]
    killed = threading.Event()

    def kill_mid_run() -> None:
        wait_until(lambda: run.learner.version >= 3 or run.lifetime.stopping, 300)
        if not run.lifetime.stopping:
            os.kill(victim, signal.SIGKILL)
            killed.set()

    threading.Thread(target=kill_mid_run, daemon=True).start()
    result = run.run()
    assert killed.is_set()
    assert result.updates == cfg.num_updates == 24
    assert result.ray.restarts == 1 and last_line(result.run_dir)["ray/worker-0/restarts"] == 1
    ray_helpers.assert_consumed_once(result.ray.stamps, 2, 24)
    restarts_of_0 = [r for w, r, _ in result.ray.stamps if w == 0]
    assert (
        restarts_of_0 == sorted(restarts_of_0) and restarts_of_0[-1] == 1
    )  # the new worker filled the rest
    assert all(r == 0 for w, r, _ in result.ray.stamps if w == 1)
    assert run.fleet.worker_pids()[0] != victim
    # One node: no weights left the learner's node, the restarted worker's pulls included.
    line = last_line(result.run_dir)
    assert result.ray.weight_bytes_out == line["ray/weight_bytes_out_per_version"] == 0, line
    # The console: podrace's lines only.
    out, err = capfd.readouterr()
    assert "(raylet)" not in out + err and "RAY_AUTH_MODE" not in out + err, out + err
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("podrace.runtime.ray")]
    assert len(lines) == 2, lines
    assert lines[0].startswith("ray worker 0 lost on node ") and lines[0].endswith(
        "; restarting it, restart 1 of 3 (--ray.max-restarts)"
    ), lines
    assert lines[1].startswith("ray worker 0 restarted on node "), lines
    # the raylet's report of the killed worker, which Ray would print on the console
    assert "(raylet) A worker died" in (result.run_dir / "ray.log").read_text()
    assert (result.run_dir / "ray-logs").is_dir()  # the local Ray's logs, kept
    assert any((result.run_dir / "ray-logs").glob("raylet*"))
    assert not process_tree(run.cluster.connection.temp_dir) and not ray.is_initialized()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_worker_killed_while_it_starts_is_restarted(tmp_path, monkeypatch):
    """While restarts are left, a worker that dies as it starts is restarted and the run
    goes on (no exit 1, no multi-line ActorDiedError)."""
    from podrace.runtime.run import prepare

    monkeypatch.setenv(ray_helpers.DIES_ONCE, str(tmp_path / "died"))
    cfg = small_ray(tmp_path, **{"ray.num_workers": 1})
    run = prepare(cfg, envs=EnvSource(cfg.env, ray_helpers.dies_once_while_starting))
    result = run.run()
    assert (tmp_path / "died").exists()
    assert result.updates == cfg.num_updates and result.ray.restarts == 1
    assert not process_tree(run.cluster.connection.temp_dir)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_crash_loop_fails_naming_the_worker_and_leaves_nothing(tmp_path):
    from podrace.runtime.run import prepare

    cfg = small_ray(tmp_path, **{"ray.num_workers": 1, "ray.max_restarts": 1})
    run = prepare(cfg, envs=EnvSource(cfg.env, ray_helpers.raising_env))
    start = time.monotonic()
    with pytest.raises(ComponentError) as caught:
        run.run()
    elapsed = time.monotonic() - start
    message = str(caught.value)
    assert caught.value.component == "ray-worker-0", message
    assert "ray worker 0 failed 2 times, restart limit 1" in message
    assert "EnvExploded: boom" in message and "\n" not in message
    assert elapsed < 240  # bounded: two failures and one restart, not a hang
    assert not process_tree(run.cluster.connection.temp_dir) and not ray.is_initialized()


ENDLESS = ("--total-steps", "10000000", "--log.interval-s", "0.2")
"""A budget no test reaches, and metrics lines often enough to wait for."""


def wait_for_two_lines(metrics, proc) -> None:
    wait_until(
        lambda: metrics.exists() and metrics.read_text().count("\n") >= 2,
        240,
        while_alive=proc,
    )


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_sigkilled_drivers_ray_is_swept_by_the_next_start_whose_sigterm_leaves_nothing(
    tmp_path,
):
    """SIGKILL leaves the driver no chance to stop its Ray; the next local start stops it.
    That run, stopped by SIGTERM, stops cleanly and leaves no process of its own."""
    marker = ray_helpers.short_tmpdir()
    env = ray_helpers.base_env(marker)
    killed = subprocess.Popen(
        ray_helpers.ray_cli_run(tmp_path, "killed", "--ray.num-workers", "1", *ENDLESS),
        env=env,
        stderr=subprocess.DEVNULL,
    )
    stopped = None
    try:
        wait_for_two_lines(tmp_path / "killed" / "metrics.jsonl", killed)
        killed.kill()
        killed.wait()
        # Ray's processes stay after their driver's SIGKILL: nothing marks their chance to
        # go having passed, so they get a second. A loaded machine can only make this check
        # pass vacuously.
        time.sleep(1.0)
        [orphan_dir] = [p for p in os.listdir(marker) if p.startswith("podrace-ray-")]
        orphans = process_tree(os.path.join(marker, orphan_dir))
        assert ray_helpers.alive(orphans), "nothing was left behind: the test proves nothing"

        stopped = subprocess.Popen(
            ray_helpers.ray_cli_run(tmp_path, "stopped", "--ray.num-workers", "2", *ENDLESS),
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for_two_lines(tmp_path / "stopped" / "metrics.jsonl", stopped)
        # The run swept the orphaned Ray as it started: its processes and its temp dir.
        assert not ray_helpers.alive(orphans) and orphan_dir not in os.listdir(marker)
        stopped.send_signal(signal.SIGTERM)
        stderr = stopped.communicate(timeout=60)[1]
        assert stopped.returncode == 128 + signal.SIGTERM, stderr[-3000:]
        assert "stopped cleanly" in stderr
        # processes killed at exit may take a moment to vanish
        wait_until(
            lambda: not ray_helpers.leftovers(marker), 20, lambda: ray_helpers.leftovers(marker)
        )
        assert not [p for p in os.listdir(marker) if p.startswith("podrace-ray-")]
    finally:
        for proc in (killed, stopped):
            if proc is not None and proc.poll() is None:
                proc.kill()
        for line in ray_helpers.leftovers(marker):  # never leave a Ray running, whatever failed
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line.split(":")[0]), signal.SIGKILL)
        shutil.rmtree(marker, ignore_errors=True)


@pytest.mark.timeout(60)
def test_the_runtime_never_lets_ray_auto_start():
    code = (
        "from podrace.runtime.ray.cluster import import_ray\n"
        "ray = import_ray()\n"
        "try:\n"
        "    ray.put(1)\n"
        "except Exception as error:\n"
        "    print('refused:', type(error).__name__)\n"
        "print('initialized:', ray.is_initialized())\n"
    )
    env = {k: v for k, v in ray_helpers.base_env("/tmp").items() if k != "RAY_ENABLE_AUTO_CONNECT"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=50
    )
    assert "refused:" in out.stdout and "initialized: False" in out.stdout, (
        out.stdout + out.stderr[-2000:]
    )


def test_a_live_or_unknown_owners_ray_is_never_swept(tmp_path, monkeypatch):
    from podrace.runtime.ray import processes as ray_processes

    monkeypatch.setattr(ray_processes.tempfile, "gettempdir", lambda: str(tmp_path))
    live = tmp_path / "podrace-ray-live"
    live.mkdir()
    ray_processes.write_owner(str(live))  # this process: alive
    unknown = tmp_path / "podrace-ray-unknown"
    unknown.mkdir()  # no owner record yet (its owner may be writing it)
    dead = tmp_path / "podrace-ray-dead"
    dead.mkdir()
    (dead / "owner").write_text("999999999 1\n")
    other = tmp_path / "not-podrace"
    other.mkdir()
    (other / "owner").write_text("999999999 1\n")
    assert ray_processes.sweep_orphans() == [str(dead)]
    assert live.exists() and unknown.exists() and other.exists() and not dead.exists()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_thread_runtime_never_imports_ray(tmp_path):
    code = (
        "import sys; from podrace.config import replace; from podrace.presets import PRESETS\n"
        "from podrace.runtime.run import train\n"
        "cfg = replace(PRESETS['cartpole-ppo'][1], total_steps=1024, rollout_length=16, "
        "**{'env.num_envs': 8, 'eval.episodes': 1, 'eval.num_envs': 1, 'log.console': 'none', "
        f"'log.run_dir': {str(tmp_path)!r}}})\n"
        "assert train(cfg).updates == 8\n"
        "assert 'ray' not in sys.modules, 'the thread runtime imported ray'\n"
    )
    subprocess.run(
        [sys.executable, "-c", code], env=ray_helpers.base_env("/tmp"), check=True, timeout=110
    )


@pytest.mark.timeout(60)
def test_ray_config_errors_are_one_line():
    from podrace.validation import validate

    base = replace(PRESETS["cartpole-ppo"][1], runtime="ray")
    for changes, expected in [
        ({"ray.num_workers": 0}, "ray.num_workers must be positive"),
        ({"ray.worker_resources": ("actor_node",)}, "NAME=AMOUNT"),
        ({"ray.worker_resources": ("CPU=2",)}, "custom resource"),
        ({"ray.max_restarts": -1}, "ray.max_restarts"),
        ({"ray.address": "nohost"}, "HOST:PORT"),
    ]:
        with pytest.raises(ConfigError, match=expected) as caught:
            validate(replace(base, **changes))
        assert "\n" not in str(caught.value)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_cli_without_ray_or_with_auth_disabled_is_a_one_line_error(tmp_path):
    cli = ["train", "cartpole-ppo", "--runtime", "ray", "--log.run-dir", str(tmp_path)]
    no_ray = (
        "import sys; sys.modules['ray'] = None; from podrace.cli import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    env = ray_helpers.base_env("/tmp")
    done = run_podrace(*cli, script=no_ray, env=env, timeout=100)
    assert done.returncode == 2 and done.stderr.strip() == (
        "podrace: error: --runtime ray needs Ray: pip install 'podrace[ray]'"
    ), done.stderr
    env["RAY_AUTH_MODE"] = "disabled"
    done = run_podrace(*cli, env=env, timeout=100)
    assert done.returncode == 2 and done.stderr.startswith(
        "podrace: error: RAY_AUTH_MODE=disabled"
    ), done.stderr
    assert done.stderr.count("\n") == 1 and not list(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_learner_error_stops_every_worker(tmp_path):
    from podrace.runtime.run import prepare

    run = prepare(small_ray(tmp_path))
    update, calls = run.learner.update_fn, []

    def failing_update(state, trajs, keys):
        calls.append(1)
        if len(calls) == 3:
            raise FloatingPointError("injected learner failure")
        return update(state, trajs, keys)

    run.learner.update_fn = failing_update
    pids = run.fleet.worker_pids()
    with pytest.raises(
        ComponentError, match="learner failed: FloatingPointError: injected learner failure"
    ):
        run.run()
    assert not process_tree(run.cluster.connection.temp_dir) and not any(
        os.path.exists(f"/proc/{p}") for p in pids
    )


@pytest.mark.timeout(60)
def test_restart_seeds_are_fresh_and_derived():
    import numpy as np

    from podrace.runtime.build import env_seed, seed_key
    from podrace.runtime.ray.worker import worker_seeds

    key0, env0 = worker_seeds(7, 1, 0)
    assert env0 == env_seed(7, 0, 1) and np.array_equal(key0, seed_key(7, 2, 1))  # = thread actor 1
    seeds = {(w, r): worker_seeds(7, w, r) for w in range(3) for r in range(3)}
    assert len({env for _, env in seeds.values()}) == 9
    assert len({tuple(np.asarray(key).tolist()) for key, _ in seeds.values()}) == 9
    assert (
        worker_seeds(7, 2, 2)[1] == seeds[(2, 2)][1]
        and worker_seeds(8, 2, 2)[1] != seeds[(2, 2)][1]
    )


@pytest.mark.timeout(60)
def test_envs_per_worker_sets_each_workers_envs():
    from podrace.config import resolved
    from podrace.validation import validate

    cfg = replace(
        PRESETS["cartpole-ppo"][1],
        runtime="ray",
        **{"ray.num_workers": 3, "ray.envs_per_worker": 4},
    )
    validate(cfg)
    cfg = resolved(cfg)
    assert (cfg.env.num_envs, cfg.num_actors, cfg.steps_per_update) == (
        4,
        3,
        3 * 4 * cfg.rollout_length,
    )
    assert replace(cfg, runtime="threads").num_actors == 1  # the thread layout is untouched


@pytest.mark.timeout(40)
def test_joining_an_address_where_nothing_listens_is_a_one_line_error():
    """`--ray.address 127.0.0.1:1` is a one-line error, not minutes of waiting in ray.init."""
    from podrace.config import RayConfig
    from podrace.runtime.ray.cluster import connect

    with pytest.raises(ConfigError, match="cannot join the Ray cluster at 127.0.0.1:1") as caught:
        with connect(RayConfig(address="127.0.0.1:1"), num_cpus=1):
            pass
    assert "\n" not in str(caught.value)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "answer", [None, b"HTTP/1.1 400 Bad Request\r\n\r\n"], ids=["silent", "http1"]
)
def test_joining_a_port_where_something_else_listens_is_a_one_line_error(answer):
    """A port that accepts TCP but is not Ray is a one-line error, not ray.init retrying for
    minutes."""
    from podrace.config import RayConfig
    from podrace.runtime.ray.cluster import connect

    server = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{server.getsockname()[1]}"

    def serve():
        with contextlib.suppress(OSError):
            conn, _ = server.accept()
            if answer:
                conn.sendall(answer)
            time.sleep(15)  # a server that never answers (more)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    start = time.monotonic()
    try:
        with pytest.raises(
            ConfigError, match=f"cannot join the Ray cluster at {address}: something listens"
        ) as caught:
            with connect(RayConfig(address=address, start_timeout_s=3), num_cpus=1):
                pass
    finally:
        server.close()
    assert "\n" not in str(caught.value) and time.monotonic() - start < 10


def started(agent: int, viewer: int, log: str) -> bool:
    """The agent has renamed itself and the viewer has opened the log."""
    try:
        with open(f"/proc/{agent}/cmdline", "rb") as f:
            renamed = f.read().startswith(b"ray::DashboardAgent")
        fds = os.listdir(f"/proc/{viewer}/fd")
        return renamed and any(os.readlink(f"/proc/{viewer}/fd/{fd}") == log for fd in fds)
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_sweep_orphans_kills_the_orphans_ray_but_not_a_users_log_viewer(tmp_path, monkeypatch):
    """sweep_orphans stops the processes of a dead driver's Ray, never a user's `tail -f`
    of its logs or a script that was given its path."""
    import tempfile

    from podrace.runtime.ray import processes as ray_processes

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
    agent = subprocess.Popen(
        ["bash", "-c", f'exec -a "ray::DashboardAgent" sleep 60 > {orphan}/logs/agent.out']
    )
    try:
        wait_until(lambda: started(agent.pid, viewer.pid, os.path.realpath(log)))
        assert ray_processes.sweep_orphans() == [str(orphan)]
        assert agent.wait(timeout=5) == -9
        assert viewer.poll() is None and script.poll() is None
        assert not orphan.exists()
    finally:
        for p in (viewer, script, agent):
            if p.poll() is None:
                os.kill(p.pid, 9)
                p.wait()


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_stopped_ray_run_resumes_to_its_end_consuming_every_rollout_once(tmp_path):
    """A Ray run stopped (as by SIGTERM) saves its last state; the resumed run starts every
    worker as a new incarnation at the checkpoint's next seqs: across both parts every
    (worker, seq) is consumed exactly once, no stamp twice, no gap."""
    from podrace.checkpoints.resume import Resume
    from podrace.runtime.run import prepare

    cfg = small_ray(tmp_path, **{"log.run_name": "r"})
    run = prepare(cfg)
    stop_after(run, 5, "SIGTERM received")
    first = run.run()
    assert (first.updates, first.checkpoint, first.topology) == (5, 5, "ray")

    resumed = prepare(None, resume=Resume(tmp_path / "r"))
    second = resumed.run()
    assert (second.updates, second.checkpoint) == (cfg.num_updates, cfg.num_updates) == (12, 12)
    assert second.env_steps == 12 * 2 * 8 * 16
    stamps = first.ray.stamps + second.ray.stamps
    ray_helpers.assert_consumed_once(stamps, 2, 12)
    assert len(set(stamps)) == len(stamps)
    assert {r for _, r, _ in first.ray.stamps} == {0} and {r for _, r, _ in second.ray.stamps} == {
        1
    }
    assert [s for w, _, s in second.ray.stamps if w == 0] == list(range(5, 12))
    assert not ray.is_initialized()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_podrace_train_runs_the_ray_topology(tmp_path):
    import podrace

    result = podrace.train(small_ray(tmp_path, total_steps=2 * 8 * 16 * 4))
    assert (result.topology, result.updates) == ("ray", 4)
    ray_helpers.assert_consumed_once(result.ray.stamps, 2, 4)
    assert result.final_eval is not None and not ray.is_initialized()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "changes", [{}, {"layout.inference": "server", "env.workers": 1}], ids=["actors", "served"]
)
def test_an_unpicklable_env_factory_is_one_line_before_ray_starts(tmp_path, monkeypatch, changes):
    from podrace.runtime.ray import cluster as ray_cluster

    def connect(*args, **kwargs):
        raise AssertionError("Ray was started before the factory was checked")

    monkeypatch.setattr(ray_cluster, "connect", connect)
    lock = threading.Lock()

    def holds_a_lock(num_envs, seed):
        with lock:
            return ray_helpers.make_env(ray_helpers.EnvConfig(), num_envs, seed)

    with pytest.raises(ConfigError) as caught:
        podrace.train(small_ray(tmp_path, **changes), holds_a_lock)
    assert str(caught.value).startswith(
        "the env factory 'test_an_unpicklable_env_factory_is_one_line_before_ray_starts."
        "<locals>.holds_a_lock' cannot be sent to Ray workers (TypeError: cannot pickle "
    ), caught.value
    assert "\n" not in str(caught.value)
    assert not ray.is_initialized() and not list(tmp_path.iterdir())
