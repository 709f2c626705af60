"""What a Ray run shows on the console: podrace's own lines, not Ray's messages.

Each test starts its own private local Ray (`podrace.runtime.ray.cluster.connect`, or a run)
and leaves nothing of it behind.
"""

from __future__ import annotations

import pytest

from podrace.config import RayConfig
from podrace.runtime.ray import cluster as ray_cluster

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
