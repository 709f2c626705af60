"""The suite's XLA flags (set in tests/conftest.py), for tests that start processes."""

from __future__ import annotations

DEVICE_COUNT = "--xla_force_host_platform_device_count"


def without_device_count(env: dict[str, str]) -> dict[str, str]:
    """A copy of `env` without the suite's forced device count, every other XLA flag kept:
    for a process that chooses its own (a multi-process run, the CLI from a config)."""
    out = dict(env)
    out["XLA_FLAGS"] = " ".join(
        f for f in out.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_COUNT)
    )
    return out
