"""`ray` transport specifics: readers in other workers, publisher death, object lifetime."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from tests.sync import workers
from tests.sync.readers import wake_of_a_waiting_reader
from tests.waiting import wait_until

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.timeout(120)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:os.fork")
def test_podrace_sync_imports_without_ray():
    code = "import sys, podrace.sync, podrace.sync.shm; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.getcwd(), timeout=60)


@pytest.mark.slow
def test_reader_in_another_worker_process(ray_session):
    from podrace.sync.ray_transport import RayPublisher

    pub = RayPublisher()
    sub = pub.subscribe(name="remote")
    reader = ray.remote(num_cpus=0)(workers.read_remote)
    pending = reader.remote(sub, 1)
    pub.publish(workers.stamped_params(0, 64))
    pub.publish(workers.stamped_params(1, 64))
    version, stamp, pid = ray.get(pending, timeout=60)
    assert version == 1 and stamp == 1 and pid != os.getpid()
    pub.close()


@ray.remote(num_cpus=0)
class _Learner:
    """Owns a publisher in its own worker process, so the test can kill that process."""

    def __init__(self) -> None:
        from podrace.sync.ray_transport import RayPublisher

        self.pub = RayPublisher()

    def subscriber(self):
        return self.pub.subscribe(name="driver")

    def publish(self, version: int) -> int:
        return self.pub.publish(workers.stamped_params(version, 64))


@pytest.mark.slow
def test_publisher_death_wakes_readers(ray_session):
    learner = _Learner.remote()
    sub = ray.get(learner.subscriber.remote())
    ray.get(learner.publish.remote(0))
    assert workers.stamp_of(sub.get(0, timeout=30).params) == 0
    # Woken by the death (ChannelClosed) within the join, long before its get's 60 s timeout.
    errors = wake_of_a_waiting_reader(sub, lambda: ray.kill(learner, no_restart=True), 30)
    assert errors and "went away" in str(errors[0][1]), errors


def test_old_versions_are_freed(ray_session):
    from podrace.sync.ray_transport import RayPublisher

    counts = getattr(
        ray._private.worker.global_worker.core_worker, "get_all_reference_counts", None
    )
    if counts is None:
        pytest.skip("this Ray exposes no reference counts")
    before = len(counts())
    pub = RayPublisher(keep=2)
    sub = pub.subscribe()
    for v in range(30):
        pub.publish({"x": np.full((1 << 16,), v)})
        sub.get(v, timeout=30)
    assert pub.metrics()["objects_alive"] == 2
    assert len(counts()) - before <= 4  # keep=2 objects (+ the board's bookkeeping), not 30
    pub.close()
    sub.close()

    def freed() -> bool:
        gc.collect()  # refs caught in reference cycles are freed only by the collector
        return len(counts()) <= before + 1

    wait_until(freed, 10, counts, interval=0.05)


@ray.remote(num_cpus=0)
def _stress_reader(sub, final: int) -> dict:
    out = workers.read_until(sub, final, stall=60)
    sub.close()
    return out


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_stress_reader_workers_never_see_torn_or_older_snapshots(ray_session):
    from podrace.sync.ray_transport import RayPublisher

    n_versions, n_elems = 1000, 4096
    pub = RayPublisher()
    readers = [_stress_reader.remote(pub.subscribe(name=f"r{i}"), n_versions - 1) for i in range(2)]
    probe = pub.subscribe()
    pub.publish(workers.stamped_params(0, n_elems))
    probe.get(0, timeout=60)
    wait_until(  # readers' workers started: each has read version 0
        lambda: all(pub.metrics().get(f"subscriber/r{i}/acked_version", -1) >= 0 for i in range(2)),
        60,
        pub.metrics,
    )
    for v in range(1, n_versions):
        pub.publish(workers.stamped_params(v, n_elems))
        if v % 4 == 0:
            pub.flush(timeout=30)
    outs = ray.get(readers)  # each gives up after 60 s without a newer version
    written = pub.metrics()["deliver/seconds/count"]
    pub.close()
    assert written >= n_versions // 4
    for out in outs:
        assert out["torn"] == 0 and out["regressions"] == 0, out
        assert out["last"] == n_versions - 1 and out["seen"] > 0, out


def test_relay_gives_a_node_one_transfer(ray_session):
    from podrace.sync.local import LocalPublisher
    from podrace.sync.ray_transport import RayPublisher
    from podrace.sync.relay import Relay

    upstream = RayPublisher()
    node = LocalPublisher()
    relay = Relay(upstream.subscribe(name="node0"), node)
    local_workers = [node.subscribe() for _ in range(6)]
    for v in range(3):
        upstream.publish(workers.stamped_params(v, 64))
        for w in local_workers:
            snap = w.get(v, timeout=30)
            assert snap.version == v and workers.stamp_of(snap.params) == v
    upstream_readers = [k for k in upstream.metrics() if k.endswith("/acked_version")]
    assert upstream_readers == ["subscriber/node0/acked_version"]
    upstream.close()
    relay.join(30)
    assert node.closed


@ray.remote(num_cpus=0)
class _Reader:
    """Holds a subscriber in a worker process that the test kills."""

    def __init__(self, sub) -> None:
        self.sub = sub

    def read(self, min_version: int) -> int:
        return self.sub.get(min_version, timeout=30).version


@pytest.mark.slow
def test_dead_subscribers_are_dropped_from_metrics(ray_session):
    from podrace.sync.ray_transport import RayPublisher

    pub = RayPublisher()
    live = pub.subscribe(name="live", long_poll=0.5)
    reader = _Reader.remote(pub.subscribe(name="doomed", long_poll=0.5))
    pub.publish(workers.stamped_params(0, 8))
    assert ray.get(reader.read.remote(0), timeout=60) == 0 and live.get(0, timeout=30).version == 0

    def wait_for(predicate) -> None:
        wait_until(lambda: predicate(pub.metrics()), 60, pub.metrics, interval=0.1)

    wait_for(
        lambda m: (
            m.get("subscriber/doomed/acked_version") == 0 and "subscriber/live/acked_version" in m
        )
    )
    ray.kill(reader, no_restart=True)
    wait_for(lambda m: "subscriber/doomed/acked_version" not in m)
    m = pub.metrics()
    assert (
        "subscriber/doomed/lag" not in m and m["subscriber/live/acked_version"] == 0
    )  # alive: kept
    live.close()
    pub.close()


@pytest.mark.slow
def test_copies_of_a_subscriber_are_reported_apart(ray_session):
    """A subscriber passed to a Ray actor is a copy with the same name: its acks are kept
    apart from the original's on the board, and closing one removes only its own entry."""
    from podrace.sync.ray_transport import RayPublisher

    pub = RayPublisher()
    original = pub.subscribe(name="actor", long_poll=0.5)
    copy = _Reader.remote(original)
    pub.publish(workers.stamped_params(0, 8))
    assert original.get(0, timeout=30).version == 0
    pub.publish(workers.stamped_params(1, 8))
    assert ray.get(copy.read.remote(1), timeout=60) == 1

    def acked() -> dict[str, int]:
        return {k: v for k, v in pub.metrics().items() if k.endswith("/acked_version")}

    wait_until(lambda: sorted(acked().values()) == [0, 1], 30, acked)
    assert set(acked()) == {"subscriber/actor/acked_version", "subscriber/actor#2/acked_version"}
    original.close()
    wait_until(lambda: list(acked().values()) == [1], 30, acked)  # the copy is still reported
    ray.kill(copy, no_restart=True)
    pub.close()


@ray.remote(num_cpus=0)
def _read_error(sub) -> tuple[str, str]:
    try:
        sub.get(0, timeout=30)
    except Exception as exc:  # noqa: BLE001 - returned for the assertion
        return type(exc).__name__, str(exc)
    finally:
        sub.close()
    return "", ""


def test_a_type_the_reader_cannot_import_gives_a_clear_error(ray_session):
    import types

    from podrace.sync.ray_transport import RayPublisher

    mod = types.ModuleType("podrace_driver_only_types")  # importable in this process only
    exec("from typing import NamedTuple\nclass Params(NamedTuple):\n    w: object\n", mod.__dict__)
    sys.modules[mod.__name__] = mod
    try:
        pub = RayPublisher()
        pending = _read_error.remote(pub.subscribe(name="remote"))
        pub.publish(mod.Params(np.ones(3)))
        kind, message = ray.get(pending, timeout=60)
        assert kind == "SyncError", (kind, message)
        assert (
            "podrace_driver_only_types" in message and "not in the publisher's __main__" in message
        )
        pub.close()
    finally:
        del sys.modules[mod.__name__]


@ray.remote(num_cpus=0)
class _TaskHost:
    """A reused worker process that gets a pickled subscriber per call and never closes it."""

    def use(self, sub) -> int:
        return sub.get(0, timeout=30).version

    def fetch_threads(self) -> list[str]:
        gc.collect()
        return [t.name for t in threading.enumerate() if t.name.startswith("podrace-ray-fetch")]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_subscriber_dropped_without_close_stops_fetching(ray_session):
    """A subscriber a task uses and drops leaves no fetch thread behind, pulling every later
    version into the worker and reported in the publisher's metrics with a growing lag."""
    from podrace.sync.ray_transport import RayPublisher

    pub = RayPublisher()
    host = _TaskHost.remote()
    pub.publish(workers.stamped_params(0, 8))
    for i in range(3):
        assert (
            ray.get(host.use.remote(pub.subscribe(name=f"task{i}", long_poll=0.5)), timeout=60) == 0
        )
    pub.publish(workers.stamped_params(1, 8))
    wait_until(
        lambda: (
            not ray.get(host.fetch_threads.remote(), timeout=30)
            and not any(k.startswith("subscriber/task") for k in pub.metrics())
        ),
        30,
        lambda: (ray.get(host.fetch_threads.remote()), pub.metrics()),
        interval=0.2,
    )
    live = pub.subscribe(name="live")  # a subscriber still referenced keeps working
    assert live.get(1, timeout=30).version == 1
    live.close()
    pub.close()


AFTER_SHUTDOWN = """
import gc, os, sys, time
import ray
from podrace.sync.base import SyncError
from podrace.sync.ray_transport import RayPublisher
from tests.sync import workers

ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
pub = RayPublisher()
kept, dropped = pub.subscribe(name="kept"), pub.subscribe(name="dropped")
pub.publish(workers.stamped_params(0, 8))
assert kept.get(0, timeout=30).version == 0 and dropped.get(0, timeout=30).version == 0
ray.shutdown()
del dropped
gc.collect()  # its finalizer tells the board it is gone: not with Ray shut down
try:
    kept.get(1, timeout=10)  # its fetch thread sees Ray is gone and ends
    raise AssertionError("kept.get after shutdown returned")
except SyncError:
    pass
pub.publish(workers.stamped_params(1, 8))
try:
    pub.flush(timeout=10)
    raise AssertionError("flush after shutdown returned")
except SyncError:
    pass
kept.close()
pub.close()
pub.metrics()
# A fetch thread may still sit in a call Ray never answers: nothing marks the end of the
# time in which a late caller could start a Ray. A loaded machine can only make this pass
# vacuously.
time.sleep(1.0)
if ray.is_initialized():
    print("initialized", flush=True)
    ray.shutdown()  # the Ray that should not have started
else:
    print("not initialized", flush=True)
os._exit(0)  # threads left in a call to the shut-down Ray must not run at exit
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_nothing_starts_a_new_ray_after_shutdown():
    """After ray.shutdown(), neither a subscriber collected, closed or still fetching nor a
    publisher publishing or closing auto-starts a fresh local Ray in the process.

    In a process of its own: the fetch threads left in calls to the shut-down Ray may abort
    whatever process holds them later on."""
    done = subprocess.run(
        [sys.executable, "-c", AFTER_SHUTDOWN],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=os.getcwd(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "not initialized", done.stdout
