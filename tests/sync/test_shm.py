"""`shm` transport specifics: other processes, torn-read safety, publisher death, cleanup."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import threading
import time
import warnings

import jax
import numpy as np
import pytest

from podrace.sync.base import ChannelClosed, SnapshotMismatch, SyncError
from podrace.sync.shm import ShmPublisher
from podrace.sync.shm_subscriber import ShmSubscriber
from tests.sync import workers
from tests.sync.readers import wake_of_a_waiting_reader
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(90)
ctx = mp.get_context("spawn")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def segment_exists(name: str) -> bool:
    return os.path.exists(f"/dev/shm/{name}")


def test_snapshots_are_read_only_host_copies():
    pub = ShmPublisher()
    sub = pub.subscribe()
    params = workers.stamped_params(3, 32)
    pub.publish(params)
    snap = sub.get(0, timeout=10)
    assert isinstance(snap.params["x"], np.ndarray) and not snap.params["x"].flags.writeable
    params["x"][:] = -1  # the publisher's arrays are not aliased
    assert workers.stamp_of(snap.params) == 3
    pub.close()


def test_device_subscriber_gets_arrays_on_its_device():
    dev = jax.devices()[2]
    pub = ShmPublisher()
    sub = pub.subscribe(dev)
    pub.publish(jax.device_put(workers.stamped_params(1, 32), jax.devices()[0]))
    snap = sub.get(0, timeout=10)
    assert snap.params["x"].devices() == {dev}
    assert workers.stamp_of(snap.params) == 1
    pub.close()


def test_publish_with_other_structure_is_rejected():
    pub = ShmPublisher()
    pub.publish(workers.stamped_params(0, 8))
    with pytest.raises(SnapshotMismatch, match=r"\['x'\].*int64\[8\].*int64\[9\]"):
        pub.publish(workers.stamped_params(1, 9))
    pub.close()


def test_close_unlinks_segments_and_missing_channel_is_clear():
    pub = ShmPublisher()
    pub.publish(workers.stamped_params(0, 8))
    sub = pub.subscribe()
    sub.get(0, timeout=10)
    assert segment_exists(pub.name) and segment_exists(pub.name + "_d")
    pub.close()
    assert not segment_exists(pub.name) and not segment_exists(pub.name + "_d")
    with pytest.raises(ChannelClosed, match="closed by its publisher"):
        sub.get(0, timeout=5)
    with pytest.raises(ChannelClosed, match="does not exist"):
        ShmSubscriber(pub.name)
    sub.close()


def test_subscriber_before_first_publish_waits():
    pub = ShmPublisher()
    sub = pub.subscribe()
    assert sub.poll() is None
    threading.Timer(0.1, lambda: pub.publish(workers.stamped_params(0, 8))).start()
    assert sub.get(0, timeout=10).version == 0
    pub.close()


def test_acks_reach_the_publisher_metrics():
    pub = ShmPublisher()
    subs = [pub.subscribe(name=f"a{i}") for i in range(2)]
    pub.publish(workers.stamped_params(0, 8))
    subs[0].get(0, timeout=10)
    wait_until(lambda: pub.metrics().get("subscriber/a0/acked_version") == 0, 10, pub.metrics)
    # A subscriber can read a version a moment before the publisher's delivery thread
    # records it as visible; flush() returns once it has.
    pub.flush(timeout=10)
    m = pub.metrics()
    assert m["subscriber/a1/acked_version"] == -1 and m["visible/seconds/count"] == 1
    assert subs[0].metrics()["read/seconds/count"] == 1
    subs[1].close()
    # departed subscribers are forgotten
    wait_until(lambda: "subscriber/a1/acked_version" not in pub.metrics(), 10, pub.metrics)
    pub.close()


@pytest.mark.slow
def test_pickled_subscriber_attaches_in_another_process():
    pub = ShmPublisher()
    pub.publish(workers.stamped_params(5, 64))
    sub = ShmSubscriber(pub.name, expect=workers.stamped_params(0, 64))
    results = ctx.Queue()
    proc = ctx.Process(
        target=workers.pickled_reader, args=(pickle.loads(pickle.dumps(sub)), 0, results)
    )
    proc.start()
    assert results.get(timeout=60) == (0, 5)
    proc.join(30)
    sub.close()
    pub.close()


@pytest.mark.slow
def test_publisher_process_death_wakes_readers():
    names = ctx.Queue()
    proc = ctx.Process(target=workers.shm_publisher_then_hang, args=(names,), daemon=True)
    proc.start()
    name = names.get(timeout=60)
    sub = ShmSubscriber(name)
    assert workers.stamp_of(sub.get(0, timeout=10).params) == 0
    # Woken by the death (ChannelClosed) within the join, long before its get's 60 s timeout.
    errors = wake_of_a_waiting_reader(sub, proc.kill, 10)
    assert errors and "went away" in str(errors[0][1])
    sub.close()
    proc.join(10)
    from multiprocessing import shared_memory

    for seg in (name, name + "_d"):  # the dead process could not unlink them
        if segment_exists(seg):
            shared_memory.SharedMemory(name=seg).unlink()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_stress_reader_processes_never_see_torn_or_older_snapshots():
    n_versions, n_elems = 2000, 1 << 15  # 256 KiB per version, two slots: readers race the writer
    pub = ShmPublisher(keep=1)
    results, readies, procs = ctx.Queue(), [], []
    for _ in range(2):
        ready = ctx.Event()
        proc = ctx.Process(
            target=workers.shm_reader, args=(pub.name, n_versions - 1, ready, results)
        )
        proc.start()
        procs.append(proc)
        readies.append(ready)
    for ready in readies:
        assert ready.wait(60)
    base = workers.stamped_params(0, n_elems)
    for v in range(n_versions):
        params = {
            "x": np.full_like(base["x"], v),
            "w": base["w"] + v,
            "sum": np.array(n_elems * v + 4 * v),
        }
        pub.publish(params)
        if v % 2 == 0:
            pub.flush(timeout=10)  # let at least every other version reach the readers
    outs = [results.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(30)
    written = pub.metrics()["deliver/seconds/count"]
    pub.close()
    assert written >= n_versions // 2
    for out in outs:
        assert out["torn"] == 0 and out["regressions"] == 0, out
        assert out["last"] == n_versions - 1 and out["seen"] > 0, out


def _layout_pair(nslots: int = 2):
    from podrace.sync.shm_layout import SlotReader, SlotWriter
    from podrace.sync.spec import TreeSpec

    name = f"podrace_test_{os.getpid()}_{time.monotonic_ns() % 10**9}"
    writer = SlotWriter(name, nslots)
    spec = TreeSpec.of(workers.stamped_params(0, 1024))
    return writer, SlotReader(name), spec


def _leaves(v: int):
    return jax.tree_util.tree_leaves(workers.stamped_params(v, 1024))


def _unflatten(reader, leaves):
    return jax.tree_util.tree_unflatten(reader.layout.spec.treedef, leaves)


def test_seqlock_read_retries_when_its_slot_is_rewritten_mid_copy():
    writer, reader, spec = _layout_pair(nslots=2)
    writer.write(0, _leaves(0), spec)
    calls = []

    def consume(slot):
        calls.append(1)
        half = slot.copy()
        if len(calls) == 1:  # the writer laps the reader: version 2 lands in the slot being read
            writer.write(1, _leaves(1), spec)
            writer.write(2, _leaves(2), spec)
        return [x.copy() for x in reader.layout.views(half)]

    version, leaves = reader.read(consume, attempts=5)
    assert len(calls) == 2 and reader.retries == 1
    assert version == 2 and workers.stamp_of(_unflatten(reader, leaves)) == 2
    reader.close()
    writer.close()


def test_seqlock_never_returns_a_slot_being_written():
    from podrace.sync.shm_layout import W_SEQ0

    writer, reader, spec = _layout_pair(nslots=2)
    writer.write(0, _leaves(0), spec)
    writer.ctl[W_SEQ0] += 1  # slot 0 (LATEST) marked as being written
    assert reader.read(lambda slot: slot.copy(), attempts=3) is None
    assert reader.retries == 3
    writer.ctl[W_SEQ0] += 1
    assert reader.read(lambda slot: slot.copy(), attempts=3)[0] == 0
    reader.close()
    writer.close()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_stress_reader_threads_race_a_writer_thread_on_two_slots():
    writer, reader, spec = _layout_pair(nslots=2)
    writer.write(0, _leaves(0), spec)
    stop = threading.Event()
    bad = []

    def write_forever():
        v = 1
        while not stop.is_set():
            writer.write(v, _leaves(v), spec)
            v += 1

    def consume(slot):
        time.sleep(0)  # yields to the writer during the copy (the race under test)
        return [x.copy() for x in reader.layout.views(slot)]

    last = -1

    def read_once() -> bool:
        """One read; True once the writer has raced the reader and 10 versions went by."""
        nonlocal last
        got = reader.read(consume, attempts=1000)
        if got is not None:
            v, leaves = got
            if workers.stamp_of(_unflatten(reader, leaves)) != v or v < last:
                bad.append((v, last))
            last = v
        return last > 10 and reader.retries > 0

    t = threading.Thread(target=write_forever)
    t.start()
    try:  # reading until the writer raced the reader: a slow machine only reads longer
        wait_until(
            read_once,
            60,
            lambda: f"the writer never raced the reader ({last=}, {reader.retries=})",
            interval=0,
        )
    finally:
        stop.set()
        t.join()
    assert not bad
    reader.close()
    writer.close()


def test_read_buffers_are_reused_only_when_no_snapshot_views_them():
    pub = ShmPublisher()
    sub = pub.subscribe()
    held, buffers = [], set()
    for v in range(8):
        pub.publish(workers.stamped_params(v, 4096))
        snap = sub.get(v, timeout=10)
        if v < 2:
            held.append(snap)  # the caller keeps these: their memory must never be reused
        else:
            buffers.add(id(snap.params["x"].base))
        del snap
    assert [workers.stamp_of(s.params) for s in held] == [0, 1]
    assert len(buffers) == 2  # the other six versions alternated between two buffers
    pub.close()
    sub.close()


def test_a_held_single_leaf_snapshot_is_never_overwritten():
    """With one leaf, a held snapshot is one view of its buffer: the pool must still see it."""
    pub = ShmPublisher()
    sub = pub.subscribe()
    held = []
    for v in range(6):
        pub.publish({"x": np.full((4096,), v, np.int64)})
        snap = sub.get(v, timeout=10)
        if v == 0:
            held.append(snap.params["x"])  # the caller keeps only the array
        del snap
    assert (held[0] == 0).all()
    sub.close()
    pub.close()


def test_publish_after_a_failed_delivery_raises():
    """A delivery that fails for good (here a transform raising SystemExit, which is no
    ordinary transform error) closes the channel: flush and every later publish say so,
    subscribers raise PublisherGone."""
    from podrace.sync.base import PublisherGone, SyncError

    def transform(p):
        if int(p["n"]) == 9:
            raise SystemExit("transform gave up")
        return {"x": np.zeros(int(p["n"]), np.float32)}

    pub = ShmPublisher(transform=transform)
    sub = pub.subscribe()
    pub.publish({"n": np.array(8)})
    pub.flush(10)
    assert sub.get(0, timeout=10).params["x"].shape == (8,)
    pub.publish({"n": np.array(9)})
    with pytest.raises(SyncError, match="delivery failed"):
        pub.flush(10)
    with pytest.raises(SyncError, match="delivery failed"):
        pub.publish({"n": np.array(8)})
    with pytest.raises(PublisherGone, match="delivery failed"):
        sub.get(1, timeout=10)
    sub.close()
    pub.close()


def test_seqlock_rejects_a_slot_rewritten_between_lookup_and_copy():
    """The writer laps the reader after it read LATEST but before it read the slot's counter:
    the counter is even and steady across the copy, so only the slot's version tells."""
    from podrace.sync.shm_layout import W_LATEST

    writer, reader, spec = _layout_pair(nslots=2)
    writer.write(0, _leaves(0), spec)
    real_ctl, lapped = reader.ctl, []

    class LapAfterLookup:
        def __getitem__(self, i):
            value = real_ctl[i]
            if i == W_LATEST and not lapped:
                lapped.append(1)
                writer.write(1, _leaves(1), spec)  # slot 1
                writer.write(2, _leaves(2), spec)  # slot 0 again: the slot LATEST named
            return value

    reader.ctl = LapAfterLookup()
    got = reader.read(lambda slot: [x.copy() for x in reader.layout.views(slot)], attempts=5)
    reader.ctl = real_ctl
    assert lapped and got is not None
    version, leaves = got
    assert workers.stamp_of(_unflatten(reader, leaves)) == version == 2
    assert reader.retries == 1
    reader.close()
    writer.close()


def _start_publisher_group():
    """A publisher in a process group of its own (with its resource tracker), and its name."""
    import subprocess
    import sys

    code = (
        "import time; from podrace.sync.shm import ShmPublisher; "
        "from tests.sync.workers import stamped_params\n"
        "p = ShmPublisher(); p.publish(stamped_params(0, 8)); p.flush(30); "
        "print(p.name, flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=REPO,
    )
    return proc, proc.stdout.readline().strip()


def _kill_group(proc) -> None:
    import signal

    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    proc.stdout.close()
    # its resource tracker too: nothing of the group is left that could still clean up
    wait_until(lambda: not group_alive(proc.pid), 30)


def group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (zombies aside: nothing may reap them)."""
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, _, pgrp = f.read().rpartition(")")[2].split()[:3]
        except (OSError, ValueError):
            continue
        if int(pgrp) == pgid and state not in ("Z", "X"):
            return True
    return False


@pytest.mark.timeout(60)
def test_the_sweep_command_lists_only_dead_publishers_segments(capsys):
    from podrace.sync import shm_sweep

    live = ShmPublisher()
    live.publish(workers.stamped_params(0, 8))
    live.flush(10)
    try:
        assert shm_sweep.main(["--dry-run"]) == 0
        out = capsys.readouterr().out
        assert live.name not in out and segment_exists(live.name)
        lines = out.splitlines()
        assert lines == ["no leaked podrace segments"] or all(
            line.startswith("would remove /dev/shm/") for line in lines
        ), out
    finally:
        live.close()


@pytest.mark.slow
def test_sweep_removes_what_a_sigkilled_publisher_group_leaked():
    import subprocess
    import sys

    from podrace.sync import sweep_shm

    live = ShmPublisher()
    live.publish(workers.stamped_params(0, 8))
    live.flush(10)
    proc, name = _start_publisher_group()
    try:
        assert name and segment_exists(name) and segment_exists(name + "_d")
    finally:
        _kill_group(proc)
    assert segment_exists(name) and segment_exists(name + "_d")  # nothing cleaned up
    listed = subprocess.run(
        [sys.executable, "-m", "podrace.sync.shm_sweep", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=REPO,
    ).stdout
    assert f"would remove /dev/shm/{name}\n" in listed and segment_exists(name)
    assert live.name not in listed
    assert set(sweep_shm()) >= {name, name + "_d"}
    assert not segment_exists(name) and not segment_exists(name + "_d")
    sub = live.subscribe()  # a live publisher's channel is never swept
    assert workers.stamp_of(sub.get(0, timeout=10).params) == 0
    sub.close()
    live.close()


@pytest.mark.slow
def test_a_new_publisher_sweeps_segments_of_dead_ones():
    proc, name = _start_publisher_group()
    _kill_group(proc)
    assert segment_exists(name)
    pub = ShmPublisher()
    assert not segment_exists(name) and not segment_exists(name + "_d")
    pub.close()


@pytest.mark.slow
def test_dead_subscribers_are_dropped_from_metrics():
    pub = ShmPublisher()
    live = pub.subscribe(name="live")
    pub.publish(workers.stamped_params(0, 8))
    ready = ctx.Event()
    proc = ctx.Process(
        target=workers.shm_ack_then_hang, args=(pub.name, "doomed", ready), daemon=True
    )
    proc.start()
    try:
        assert ready.wait(60) and live.get(0, timeout=10).version == 0
        wait_until(
            lambda: pub.metrics().get("subscriber/doomed/acked_version") == 0, 30, pub.metrics
        )
    finally:
        proc.kill()
        proc.join(30)
    wait_until(lambda: "subscriber/doomed/acked_version" not in pub.metrics(), 30, pub.metrics)
    m = pub.metrics()
    assert "subscriber/doomed/lag" not in m and m["subscriber/live/acked_version"] == 0
    live.close()
    pub.close()


@pytest.mark.slow
def test_a_type_from_the_publishers_main_gives_a_clear_error():
    import subprocess
    import sys

    from podrace.sync.base import SyncError

    code = (
        "import sys, numpy as np\nfrom typing import NamedTuple\n"
        "class Params(NamedTuple):\n    w: np.ndarray\n"
        "from podrace.sync.shm import ShmPublisher\n"
        "p = ShmPublisher(); p.publish(Params(np.ones(3))); p.flush(30); "
        "print(p.name, flush=True)\n"
        "sys.stdin.read(); p.close()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        name = proc.stdout.readline().strip()
        sub = ShmSubscriber(name)
        with pytest.raises(
            SyncError, match=r"Can't get attribute 'Params'.*not in the publisher's __main__"
        ):
            sub.get(0, timeout=10)
        sub.close()
    finally:
        proc.stdin.close()
        proc.wait(30)
        proc.stdout.close()


@pytest.mark.timeout(60)
def test_a_transform_that_changes_the_layout_fails_only_its_version():
    def transform(params):  # version 1 comes out with another structure, version 2 another shape
        v = int(params["x"][0])
        if v == 1:
            return {**params, "extra": params["x"]}
        if v == 2:
            return {**params, "w": params["w"][:2]}
        return params

    pub = ShmPublisher(transform=transform)
    sub = pub.subscribe()
    for v in range(4):
        pub.publish(workers.stamped_params(v, 8))
        pub.flush(timeout=10)  # no raise: a mismatch does not close the channel
    snap = sub.get(3, timeout=10)
    assert snap.version == 3 and workers.stamp_of(snap.params) == 3
    m = pub.metrics()
    assert m["transform/failures"] == 2 and m["failed"] == 0
    pub.close()


_SMALL_SHM_SCRIPT = """
import numpy as np
from podrace.sync import PublisherGone, ShmPublisher, SyncError
with ShmPublisher(keep=1) as pub:
    sub = pub.subscribe()
    try:
        for v in range(2):  # the second version fills the second slot: 2 x 12 MiB > 16 MiB
            pub.publish({"w": np.full(3 * 2**20, v, np.float32)})
            pub.flush(timeout=30)
    except SyncError:
        pass
    try:
        sub.get(0, timeout=10)
    except PublisherGone as exc:
        assert "/dev/shm" in str(exc), exc
        print("reported")
"""


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_too_small_dev_shm_is_an_error_not_a_sigbus_of_the_learner():
    """Docker's default /dev/shm is 64 MB: versions that do not fit there are an error naming
    /dev/shm, which readers get too, not a SIGBUS of the learner."""
    import subprocess
    import sys

    mount = "mount -t tmpfs -o size=16m tmpfs /dev/shm"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", mount], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("needs `unshare -m` and mount rights to give the test its own small /dev/shm")
    env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            f'{mount} && exec "$0" -c "$1"',
            sys.executable,
            _SMALL_SHM_SCRIPT,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=50,
    )
    assert proc.returncode == 0, f"rc {proc.returncode} (-7/135: SIGBUS): {proc.stderr[-2000:]}"
    assert "reported" in proc.stdout


@pytest.mark.timeout(30)
def test_no_room_in_dev_shm_fails_the_channel_with_the_reason(monkeypatch):
    import errno

    def no_room(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    pub = ShmPublisher()
    sub = pub.subscribe()
    monkeypatch.setattr(os, "posix_fallocate", no_room)  # only the data segment is left to create
    pub.publish(workers.stamped_params(0, 8))
    with pytest.raises(SyncError, match="delivery failed"):
        pub.flush(timeout=10)
    with pytest.raises(ChannelClosed, match=r"/dev/shm cannot supply it"):
        sub.get(0, timeout=10)
    pub.close()
    assert not segment_exists(pub.name + "_d")


@pytest.mark.timeout(60)
def test_a_dropped_subscriber_releases_its_thread_socket_and_buffers():
    """Subscribers unpickled per task and never closed release their doorbell thread, socket
    and buffer pool (else RSS grows by about 2x the params per subscriber)."""
    import gc

    pub = ShmPublisher()
    pub.publish({"x": np.ones(1_000_000)})  # 8 MB
    blob = pickle.dumps(pub.subscribe(name="task"))
    gc.collect()
    threads = threading.active_count()
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(10):
        sub = pickle.loads(blob)
        assert sub.get(0, timeout=10).version == 0
        del sub  # no close()
    gc.collect()
    wait_until(lambda: threading.active_count() <= threads, 10, threading.enumerate)
    # Other threads of the process (a test runner's channel) may hold an fd for a moment.
    wait_until(
        lambda: len(os.listdir("/proc/self/fd")) <= fds, 10, lambda: os.listdir("/proc/self/fd")
    )
    kept = pickle.loads(blob)  # a live one still works, and still hears the publisher close
    assert kept.get(0, timeout=10).version == 0
    pub.close()
    with pytest.raises(ChannelClosed):
        kept.get(1, timeout=10)
    kept.close()


@pytest.mark.timeout(60)
def test_a_transform_that_raises_systemexit_fails_the_channel_loudly():
    """Not an Exception, so not a skipped version: the channel fails loudly, not with a
    silently ended delivery thread (publish succeeding, readers waiting forever, metrics
    saying failed=0)."""
    import sys

    from podrace.sync.base import PublisherGone, SyncError

    def transform(params):
        if int(params["x"][0]) == 1:
            sys.exit("transform gave up")
        return params

    pub = ShmPublisher(transform=transform)
    sub = pub.subscribe()
    pub.publish(workers.stamped_params(0, 8))
    pub.flush(timeout=10)
    pub.publish(workers.stamped_params(1, 8))
    with pytest.raises(SyncError, match="delivery failed"):
        pub.flush(timeout=10)
    with pytest.raises(PublisherGone, match="SystemExit: transform gave up"):
        sub.get(1, timeout=10)
    assert pub.metrics()["failed"] == 1
    pub.close()


def _start_forking_publisher():
    """A publisher in a process group of its own that forks a long-lived child (say an env
    worker) once a subscriber is connected; its name and that child's PID come on stdout."""
    import subprocess
    import sys

    code = (
        "import os, time; from podrace.sync.shm import ShmPublisher; "
        "from tests.sync.workers import stamped_params\n"
        "p = ShmPublisher(); p.publish(stamped_params(0, 8)); p.flush(30); "
        "print(p.name, flush=True)\n"
        "from tests.waiting import wait_until\n"
        "wait_until(lambda: any(k.endswith('/acked_version') for k in p.metrics()), 60)\n"
        "child = os.fork()\n"
        "if child == 0: time.sleep(600); os._exit(0)\n"
        "print(child, flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-W", "ignore", "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=REPO,
    )
    return proc, proc.stdout.readline().strip()


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_killed_publisher_is_gone_even_while_a_child_it_forked_lives():
    """The child does not keep the doorbell's sockets, which would leave readers waiting
    forever, let new ones attach to the dead channel, and make the sweep take it for alive."""
    import signal

    from podrace.sync import PublisherGone, sweep_shm

    proc, name = _start_forking_publisher()
    try:
        sub = ShmSubscriber(name)
        assert sub.get(0, timeout=10).version == 0
        child = int(proc.stdout.readline())  # forked with `sub` connected
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        with pytest.raises(PublisherGone, match="went away"):
            sub.get(1, timeout=10)
        sub.close()
        with pytest.raises(PublisherGone, match="went away"):
            ShmSubscriber(name)
        assert set(sweep_shm(dry_run=True)) >= {name, name + "_d"}
        os.kill(child, 0)  # still alive: all of the above held while it lived
    finally:
        _kill_group(proc)  # the forked child and the resource tracker
    sweep_shm()
    assert not segment_exists(name) and not segment_exists(name + "_d")


def _start_forked(target, *args):
    proc = mp.get_context("fork").Process(target=target, args=args)
    with (
        warnings.catch_warnings()
    ):  # JAX warns about any fork; these children run no JAX computation
        warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
        proc.start()
    return proc


def _stop(proc) -> None:
    proc.join(30)
    if proc.is_alive():
        proc.kill()
        proc.join(10)


@pytest.mark.timeout(60)
def test_a_subscriber_inherited_through_fork_reattaches_in_the_child():
    """A fork copies the subscriber instead of pickling it: the copy gets a doorbell thread
    of its own, so its get() wakes when the version is published."""
    pub = ShmPublisher()
    sub = pub.subscribe(name="reader")
    pub.publish(workers.stamped_params(0, 8))
    assert sub.get(0, timeout=10).version == 0
    results = mp.get_context("fork").Queue()
    proc = _start_forked(workers.forked_reader, sub, results)
    try:
        wait_until(
            lambda: "subscriber/reader#2/acked_version" in pub.metrics(), 20, pub.metrics
        )  # the child's copy attached
        pub.publish(workers.stamped_params(1, 8))
        assert results.get(timeout=30) == (1, 1)
        assert sub.get(1, timeout=10).version == 1  # the parent's own is unaffected
    finally:
        _stop(proc)
    sub.close()
    pub.close()


@pytest.mark.timeout(60)
def test_closing_a_forked_copy_of_a_subscriber_leaves_the_parents_alone():
    """close() in the child does not shut down the socket both share: the parent's
    subscriber neither raises PublisherGone nor vanishes from the publisher's metrics."""
    pub = ShmPublisher()
    sub = pub.subscribe(name="reader")
    pub.publish(workers.stamped_params(0, 8))
    assert sub.get(0, timeout=10).version == 0
    proc = _start_forked(workers.close_inherited, sub)
    _stop(proc)
    assert proc.exitcode == 0
    pub.publish(workers.stamped_params(1, 8))
    assert sub.get(1, timeout=10).version == 1
    wait_until(lambda: pub.metrics().get("subscriber/reader/acked_version") == 1, 10, pub.metrics)
    sub.close()
    pub.close()


@pytest.mark.timeout(60)
def test_copies_of_a_subscriber_are_reported_apart():
    """Pickled copies keep their original's name, yet each has a metrics entry of its own,
    and closing one removes only its own."""
    pub = ShmPublisher()
    a = pub.subscribe(name="actor")
    b = pickle.loads(pickle.dumps(a))
    pub.publish(workers.stamped_params(0, 8))
    assert b.get(0, timeout=10).version == 0
    pub.publish(workers.stamped_params(1, 8))
    assert a.get(1, timeout=10).version == 1

    def acked() -> dict[str, int]:
        return {k: v for k, v in pub.metrics().items() if k.endswith("/acked_version")}

    wait_until(lambda: sorted(acked().values()) == [0, 1], 10, acked)
    assert set(acked()) == {"subscriber/actor/acked_version", "subscriber/actor#2/acked_version"}
    a.close()
    wait_until(
        lambda: list(acked().values()) == [0], 10, acked
    )  # b is still reported, with its own version
    b.close()
    pub.close()


@pytest.mark.timeout(60)
def test_a_fork_child_can_neither_publish_on_nor_close_the_parents_channel():
    """A child's publish() and flush() are SyncErrors: publish would take the parent's next
    version number and flush wait forever (no delivery thread there). Its close() leaves the
    shared segment open and linked for the parent's subscribers."""
    pub = ShmPublisher()
    sub = pub.subscribe(name="reader")
    pub.publish(workers.stamped_params(0, 8))
    assert sub.get(0, timeout=10).version == 0
    results = mp.get_context("fork").Queue()
    proc = _start_forked(workers.use_inherited_publisher, pub, results)
    try:
        publish, flush, close = results.get(timeout=30)
    finally:
        _stop(proc)
    assert (
        publish.startswith("SyncError: publish() on shm channel") and "in a fork child" in publish
    )
    assert flush.startswith("SyncError: flush() on shm channel")
    assert close == "ok"
    assert pub.publish(workers.stamped_params(1, 8)) == 1
    assert sub.get(1, timeout=10).version == 1
    ShmSubscriber(pub.name).close()  # the segments are still there
    sub.close()
    pub.close()


@pytest.mark.timeout(60)
def test_python_object_leaves_are_refused_and_the_channel_goes_on():
    """An object array is refused when published, and one a transform returns skips only its
    version: neither reaches the delivery thread, which it would end (`Cannot change
    data-type for array of references`) and the channel with it."""
    good = {"w": np.arange(3, dtype=np.float32)}
    pub = ShmPublisher(transform=lambda p: {"w": np.array([object()] * 3)} if p["w"][0] == 1 else p)
    try:
        sub = pub.subscribe()
        with pytest.raises(SnapshotMismatch, match=r"\['w'\].*Python objects"):
            pub.publish({"w": np.array([object()] * 3)})
        assert pub.publish(good) == 0
        assert pub.publish({"w": good["w"] + 1}) == 1  # its transform returns objects: skipped
        pub.flush(timeout=10)
        assert pub.metrics()["transform/failures"] == 1
        assert pub.publish({"w": good["w"] + 2}) == 2
        np.testing.assert_array_equal(np.asarray(sub.get(2, timeout=10).params["w"]), good["w"] + 2)
    finally:
        pub.close()


@pytest.mark.timeout(60)
def test_a_channel_name_in_use_is_a_sync_error_naming_it():
    from podrace.sync.base import SyncError

    first = ShmPublisher(name=f"podrace_taken_{os.getpid()}")
    try:
        with pytest.raises(SyncError, match=f"podrace_taken_{os.getpid()}' exists already"):
            ShmPublisher(name=f"podrace_taken_{os.getpid()}")
    finally:
        first.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "name,problem",
    [
        ("x" * 100, "is 100 bytes, at most"),
        ("a/b", "without '/' or NUL"),
        ("..", "not . or .."),
        (5, "must be a str, got int"),
    ],
    ids=["too-long", "slash", "dot-dot", "int"],
)
def test_a_channel_name_no_socket_or_segment_can_carry_is_a_sync_error_and_creates_nothing(
    name, problem
):
    """A name no socket or segment can carry (too long for an AF_UNIX path, a '/', '..', not
    a str) is a SyncError for publisher and subscriber alike, raised before anything is
    created in /dev/shm (not a raw OSError or TypeError)."""
    from podrace.sync.base import SyncError

    before = set(os.listdir("/dev/shm"))
    with pytest.raises(SyncError, match=problem):
        ShmPublisher(name=name)
    assert set(os.listdir("/dev/shm")) <= before
    with pytest.raises(SyncError, match=problem):
        ShmSubscriber(name)
