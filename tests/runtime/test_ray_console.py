"""What a private Ray shows on the console: podrace's own lines, not Ray's messages (a run
whose worker is lost: tests/runtime/test_ray_runtime.py's SIGKILL test).

Each test starts its own private local Ray (`podrace.runtime.ray.cluster.connect`) and
leaves nothing of it behind.
"""

from __future__ import annotations

import pytest

from podrace.config import RayConfig
from podrace.runtime.ray import cluster as ray_cluster

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.filterwarnings("ignore:os.fork")


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("to_console", [False, True])
def test_rays_messages_to_the_driver_go_to_the_console_only_when_asked(
    tmp_path, to_console, capfd, monkeypatch
):
    """Either way a private Ray starts without Ray's auth opt-out message (RAY_AUTH_MODE
    unset, as a user's shell has it) and is gone after."""
    from ray._private import worker

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    printing = worker.print_to_stdstream
    with ray_cluster.connect(RayConfig(num_workers=1, log_to_console=to_console), 1) as cluster:
        assert cluster.local and ray.is_initialized()
        assert (worker.print_to_stdstream is printing) == to_console
        assert worker.global_worker.node is not None  # started, so Ray's threads run
        cluster.messages.attach(tmp_path)
        if not to_console:  # as Ray's error listener hands them over
            worker.print_to_stdstream({"lines": ["a raylet's\nreport"], "pid": "raylet"}, False)
    assert worker.print_to_stdstream is printing and not ray.is_initialized()
    out, err = capfd.readouterr()
    assert "RAY_AUTH_MODE" not in out + err, out + err
    if to_console:
        assert not (tmp_path / "ray.log").exists() and not (tmp_path / "ray-logs").exists()
    else:
        lines = (tmp_path / "ray.log").read_text().splitlines()
        assert [line.split(" ", 2)[2] for line in lines] == [
            "(raylet) a raylet's",
            "(raylet) report",
        ]
        assert any((tmp_path / "ray-logs").glob("raylet*"))
