"""What a Ray run shows on the console: podrace's own lines, not Ray's messages.

Each test starts its own private local Ray (`podrace.runtime.ray.cluster.connect`, or a run)
and leaves nothing of it behind.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

import pytest

from podrace.config import RayConfig
from podrace.runtime.ray import cluster as ray_cluster
from podrace.runtime.ray.processes import process_tree
from tests.helpers.configs import SMALL_SPU, small_ray
from tests.waiting import wait_until

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.filterwarnings("ignore:os.fork")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_private_ray_starts_without_rays_auth_opt_out_message(capfd, monkeypatch):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)  # as a user's shell has it: unset
    with ray_cluster.connect(RayConfig(num_workers=1), num_cpus=1) as cluster:
        assert cluster.local and ray.is_initialized()
    assert not ray.is_initialized()
    out, err = capfd.readouterr()
    assert "RAY_AUTH_MODE" not in out + err, out + err


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("to_console", [False, True])
def test_rays_messages_to_the_driver_go_to_the_console_only_when_asked(tmp_path, to_console):
    from ray._private import worker

    printing = worker.print_to_stdstream
    with ray_cluster.connect(RayConfig(num_workers=1, log_to_console=to_console), 1) as cluster:
        assert (worker.print_to_stdstream is printing) == to_console
        assert worker.global_worker.node is not None  # started, so Ray's threads run
        cluster.messages.attach(tmp_path)
        if not to_console:  # as Ray's error listener hands them over
            worker.print_to_stdstream({"lines": ["a raylet's\nreport"], "pid": "raylet"}, False)
    assert worker.print_to_stdstream is printing
    if to_console:
        assert not (tmp_path / "ray.log").exists() and not (tmp_path / "ray-logs").exists()
    else:
        lines = (tmp_path / "ray.log").read_text().splitlines()
        assert [line.split(" ", 2)[2] for line in lines] == [
            "(raylet) a raylet's",
            "(raylet) report",
        ]
        assert any((tmp_path / "ray-logs").glob("raylet*"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_lost_worker_is_podrace_lines_and_rays_own_output_goes_to_the_run_dir(
    tmp_path, capfd, caplog
):
    from podrace.runtime.run import prepare

    caplog.set_level(logging.INFO, logger="podrace")
    # 24 updates: long enough to lose a worker mid-run
    run = prepare(small_ray(tmp_path, total_steps=24 * SMALL_SPU, **{"log.interval_s": 2.0}))
    victim = run.fleet.worker_pids()[0]

    def kill_mid_run() -> None:
        wait_until(lambda: run.learner.version >= 3 or run.lifetime.stopping, 300)
        if not run.lifetime.stopping:
            os.kill(victim, signal.SIGKILL)

    threading.Thread(target=kill_mid_run, daemon=True).start()
    result = run.run()
    assert result.ray.restarts == 1
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
