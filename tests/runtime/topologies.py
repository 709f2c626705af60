"""The three topologies, as config changes, for tests that must hold in each of them."""

from __future__ import annotations

import pytest

TOPOLOGIES = {
    "threads": {},
    "ray": {"runtime": "ray", "ray.num_workers": 2},
    # Nothing listens at the coordinator: a process that refuses the run tells no one,
    # within the second its init timeout allows.
    "multihost": {
        "distributed.coordinator": "127.0.0.1:9",
        "distributed.num_processes": 2,
        "distributed.process_id": 0,
        "distributed.init_timeout_s": 1,
    },
}

every_topology = pytest.mark.parametrize("topology", list(TOPOLOGIES))
"""Runs the test once per topology; it takes `topology` (a key of TOPOLOGIES)."""
