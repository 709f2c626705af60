"""Transport harnesses for the sync conformance suite: one fixture, every transport."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from podrace.sync.base import Publisher, Subscriber

TRANSPORTS = ["local", "shm", "ray"]


def make_params(version: int, n: int = 16) -> dict[str, np.ndarray]:
    """Params whose every element encodes `version`, plus a checksum: torn reads show."""
    x = np.full((n,), version, dtype=np.int64)
    return {
        "x": x,
        "w": np.arange(4, dtype=np.float32) + version,
        "sum": np.array(x.sum() + 4 * version),
    }


def check_params(params: Any) -> int:
    """Return the version encoded in `params`, asserting it is internally consistent."""
    x = np.asarray(params["x"])
    v = int(x[0])
    assert (x == v).all(), f"torn snapshot: x holds {np.unique(x)}"
    assert np.array_equal(np.asarray(params["w"]), np.arange(4, dtype=np.float32) + v)
    assert int(np.asarray(params["sum"])) == x.sum() + 4 * v
    return v


class Harness:
    """How a test makes a publisher and subscribers of one transport."""

    name: str

    def publisher(
        self,
        transform: Callable | None = None,
        keep: int = 2,
        first_version: int = 0,
        like: Any = None,
    ) -> Publisher:
        raise NotImplementedError

    def subscribe(self, pub: Publisher, **kwargs: Any) -> Subscriber:
        return pub.subscribe(**kwargs)


class LocalHarness(Harness):
    name = "local"

    def publisher(self, transform=None, keep=2, first_version=0, like=None):
        from podrace.sync.local import LocalPublisher

        return LocalPublisher(transform=transform, keep=keep, first_version=first_version)


class ShmHarness(Harness):
    name = "shm"

    def publisher(self, transform=None, keep=2, first_version=0, like=None):
        from podrace.sync.shm import ShmPublisher

        return ShmPublisher(transform=transform, keep=keep, first_version=first_version)


class RayHarness(Harness):
    name = "ray"

    def publisher(self, transform=None, keep=2, first_version=0, like=None):
        from podrace.sync.ray_transport import RayPublisher

        return RayPublisher(transform=transform, keep=keep, first_version=first_version)


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray for one test module, shut down afterwards."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        # A Ray an earlier module left connected (test_ray checks, for one, that a collected
        # ray subscriber cannot auto-start Ray after shutdown): these tests need their own
        # local Ray with known resources.
        warnings.warn(
            "a Ray connection was left open by an earlier test; shutting it down", stacklevel=2
        )
        ray.shutdown()
    with (
        warnings.catch_warnings()
    ):  # Ray starts its daemons with fork_exec; JAX warns about any fork
        warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    close_ray_subscribers()
    ray.shutdown()


def close_ray_subscribers(timeout_s: float = 30.0) -> None:
    """Close every RaySubscriber this process still holds and wait for their fetch threads
    to end: a fetch thread still inside `ray.get` when Ray shuts down aborts the process
    (Ray's C++ core worker is torn down under it), tests later in the suite included."""
    import gc
    import threading

    from podrace.sync.ray_transport import RaySubscriber
    from tests.waiting import wait_until

    for obj in gc.get_objects():
        if isinstance(obj, RaySubscriber):
            obj.close()
    fetching = [t for t in threading.enumerate() if t.name.startswith("podrace-ray-fetch-")]
    wait_until(
        lambda: not any(t.is_alive() for t in fetching),
        timeout_s,
        lambda: f"ray fetch threads still alive: {[t.name for t in fetching if t.is_alive()]}",
    )


def _ray_harness(request: pytest.FixtureRequest) -> Harness:
    request.getfixturevalue("ray_session")
    return RayHarness()


HARNESSES: dict[str, Callable[[pytest.FixtureRequest], Harness]] = {
    "local": lambda request: LocalHarness(),
    "shm": lambda request: ShmHarness(),
    "ray": _ray_harness,
}


@pytest.fixture(params=TRANSPORTS)
def harness(request: pytest.FixtureRequest) -> Harness:
    return HARNESSES[request.param](request)
