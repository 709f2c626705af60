"""The weight-sync contract, checked identically against every transport."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from podrace.sync.base import ChannelClosed, Snapshot, SnapshotMismatch, SyncError, SyncTimeout
from tests.sync.conftest import check_params, make_params
from tests.waiting import calling, wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def new_pub(harness):
    made = []

    def make(**kwargs):
        kwargs.setdefault("like", make_params(0))
        pub = harness.publisher(**kwargs)
        made.append(pub)
        return pub

    yield make
    for pub in made:
        pub.close()


@pytest.mark.slow
def test_versions_start_at_first_version_and_increase(harness, new_pub):
    pub = new_pub(first_version=5)
    assert pub.latest_version is None
    assert [pub.publish(make_params(v)) for v in range(3)] == [5, 6, 7]
    assert pub.latest_version == 7
    assert harness.subscribe(pub).get(7, timeout=10).version == 7


def test_explicit_version_must_increase(harness, new_pub):
    pub = new_pub()
    assert pub.publish(make_params(10), version=10) == 10
    with pytest.raises(SyncError):
        pub.publish(make_params(10), version=10)
    assert pub.publish(make_params(11)) == 11


def test_poll_returns_only_newer_snapshots(harness, new_pub):
    pub = new_pub()
    sub = harness.subscribe(pub)
    assert sub.poll() is None and sub.acked_version is None
    pub.publish(make_params(0))
    snap = sub.get(0, timeout=10)
    assert isinstance(snap, Snapshot) and snap.version == 0 and check_params(snap.params) == 0
    assert sub.acked_version == 0
    assert sub.poll() is None  # same version again: nothing to apply
    pub.publish(make_params(1))
    pub.publish(make_params(2))
    sub.get(2, timeout=10)  # wait until visible
    assert sub.poll() is None
    pub.publish(make_params(3))
    snap = poll_until(sub)
    assert snap.version == 3 and check_params(snap.params) == 3
    assert sub.acked_version == 3 and sub.poll() is None


def poll_until(sub, timeout=10.0):
    """poll() never blocks; transports may make a publish visible a moment later."""
    return wait_until(sub.poll, timeout, lambda: "poll() saw nothing new in time")


def test_poll_skips_to_latest(harness, new_pub):
    pub = new_pub()
    sub = harness.subscribe(pub)
    for v in range(4):
        pub.publish(make_params(v))
    harness.subscribe(pub).get(3, timeout=10)  # visible now
    snap = poll_until(sub)
    assert snap.version == 3 and check_params(snap.params) == 3
    assert sub.poll() is None


def test_get_blocks_until_published(harness, new_pub):
    pub = new_pub()
    sub = harness.subscribe(pub)
    got = []
    t = threading.Thread(target=lambda: got.append(sub.get(1, timeout=20)))
    t.start()
    wait_until(lambda: calling(t, "get"))
    pub.publish(make_params(0))
    harness.subscribe(pub).get(0, timeout=10)  # version 0 is visible now
    # Nothing marks the waiter having seen version 0 and waited on: it has 0.2 s to return
    # wrongly. A loaded machine gives it less, so this can pass vacuously, never fail falsely.
    time.sleep(0.2)
    assert not got, "get(1) returned before version 1 existed"
    pub.publish(make_params(1))
    t.join(20)
    assert got and got[0].version == 1 and check_params(got[0].params) == 1


def test_get_returns_latest_when_already_satisfied(harness, new_pub):
    pub = new_pub()
    sub = harness.subscribe(pub)
    for v in range(3):
        pub.publish(make_params(v))
    harness.subscribe(pub).get(2, timeout=10)  # version 2 is visible now
    first = sub.get(0, timeout=10)
    assert first.version == 2
    again = sub.get(1, timeout=10)  # idempotent: same version, nothing newer, no new copy
    assert again is first and sub.acked_version == 2
    assert sub.poll() is None


def test_get_times_out_with_a_clear_message(harness, new_pub):
    pub = new_pub()
    sub = harness.subscribe(pub)
    pub.publish(make_params(0))
    sub.get(0, timeout=10)
    start = time.monotonic()
    with pytest.raises(SyncTimeout, match=r"(?s)>= 5.*latest.*0") as info:
        sub.get(5, timeout=0.2)
    assert isinstance(info.value, TimeoutError)
    assert time.monotonic() - start > 0.15  # it waited: no early give-up


def test_transform_runs_once_per_version(harness, new_pub):
    calls = []
    lock = threading.Lock()

    def transform(params):
        with lock:
            calls.append(int(np.asarray(params["x"])[0]))
        return {"x": params["x"], "w": params["w"], "sum": params["sum"]}

    pub = new_pub(transform=transform)
    subs = [harness.subscribe(pub) for _ in range(3)]
    for v in range(4):
        pub.publish(make_params(v))
        for sub in subs:
            assert check_params(sub.get(v, timeout=10).params) == v
    assert sorted(calls) == [0, 1, 2, 3]


def test_transform_can_select_and_cast(harness, new_pub):
    pub = new_pub(transform=lambda p: {"w": np.asarray(p["w"]).astype(np.float16)})
    sub = harness.subscribe(pub)
    pub.publish(make_params(2))
    w = sub.get(0, timeout=10).params["w"]
    assert np.asarray(w).dtype == np.float16
    np.testing.assert_array_equal(np.asarray(w), np.arange(4) + 2)


def test_push_target_called_once_per_version_in_order(harness, new_pub):
    pub = new_pub()
    seen = []
    pub.add_push_target(lambda snap: seen.append((snap.version, check_params(snap.params))), "rec")
    for v in range(5):
        pub.publish(make_params(v))
        wait_until(lambda v=v: len(seen) == v + 1)
    assert seen == [(v, v) for v in range(5)]
    assert pub.metrics()["push/rec/delivered_version"] == 4


def test_slow_push_target_does_not_block_publish(harness, new_pub):
    pub = new_pub()
    release = threading.Event()
    slow_seen, fast_seen, slow_returned = [], [], []

    def slow(snap):
        slow_seen.append(snap.version)
        release.wait(60)
        slow_returned.append(snap.version)

    pub.add_push_target(slow, "slow")
    pub.add_push_target(lambda snap: fast_seen.append(snap.version), "fast")
    sub = harness.subscribe(pub)
    pub.publish(make_params(0))
    wait_until(lambda: slow_seen == [0])  # slow target is now stuck in its call
    for v in range(1, 20):
        pub.publish(make_params(v))
    assert slow_returned == []  # every publish returned while the slow call went on
    assert sub.get(19, timeout=10).version == 19  # pulling consumers unaffected
    wait_until(lambda: fast_seen and fast_seen[-1] == 19)
    assert fast_seen == sorted(set(fast_seen))
    assert pub.metrics()["push/slow/busy_seconds"] > 0
    release.set()
    wait_until(lambda: slow_seen[-1] == 19)
    assert slow_seen == [0, 19]  # coalesced to the latest, never replayed
    assert pub.metrics()["push/slow/skipped"] >= 17


def test_failing_push_target_is_reported(harness, new_pub):
    pub = new_pub()
    errors = []

    def bad(snap):
        raise ValueError(f"boom {snap.version}")

    pub.add_push_target(bad, "bad", on_error=lambda name, exc: errors.append((name, str(exc))))
    good = []
    pub.add_push_target(lambda snap: good.append(snap.version), "good")
    for v in range(3):
        pub.publish(make_params(v))
        wait_until(lambda v=v: good and good[-1] == v)
    wait_until(lambda: pub.metrics()["push/bad/failures"] >= 1 and errors)
    assert errors[0][0] == "bad" and "boom" in errors[0][1]
    assert pub.metrics()["push/good/failures"] == 0


def test_late_push_target_gets_current_version(harness, new_pub):
    pub = new_pub()
    pub.publish(make_params(0))
    pub.publish(make_params(1))
    seen = []
    pub.add_push_target(lambda snap: seen.append(snap.version), "late")
    wait_until(lambda: seen == [1])


def test_close_wakes_blocked_get(harness, new_pub):
    pub = new_pub()
    sub = harness.subscribe(pub)
    pub.publish(make_params(0))
    errors = []

    def waiter():
        try:
            sub.get(100, timeout=600)  # far beyond the joins below: only the close ends it
        except Exception as exc:  # noqa: BLE001 - recorded for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=waiter) for _ in range(3)]
    for t in threads:
        t.start()
    wait_until(lambda: all(calling(t, "get") for t in threads))
    pub.close()
    for t in threads:
        t.join(30)
    assert len(errors) == 3 and all(isinstance(e, ChannelClosed) for e in errors)


def test_close_is_idempotent_and_final(harness, new_pub):
    pub = new_pub()
    sub = harness.subscribe(pub)
    pub.publish(make_params(0))
    sub.get(0, timeout=10)
    pub.close()
    pub.close()
    with pytest.raises(ChannelClosed):
        pub.publish(make_params(1))
    # cross-process transports learn of the close a moment later, but they do learn
    wait_until(lambda: raises_closed(lambda: sub.get(0, timeout=5)))
    with pytest.raises(ChannelClosed):
        sub.poll()
    with pytest.raises(ChannelClosed):
        sub.get(0, timeout=5)


def raises_closed(call) -> bool:
    try:
        call()
    except ChannelClosed:
        return True
    return False


def test_subscriber_close_wakes_its_get(harness, new_pub):
    pub = new_pub()
    sub = harness.subscribe(pub)
    errors = []
    t = threading.Thread(target=lambda: _record(errors, sub.get, 0, 30))
    t.start()
    wait_until(lambda: calling(t, "get"))
    sub.close()
    t.join(10)
    assert errors and isinstance(errors[0], ChannelClosed)
    pub.publish(make_params(0))  # the publisher is unaffected
    assert harness.subscribe(pub).get(0, timeout=10).version == 0


def _record(errors, fn, *args):
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001
        errors.append(exc)


def test_mismatched_snapshot_is_rejected(harness, new_pub):
    pub = new_pub()
    wrong = dict(make_params(0))
    wrong["w"] = np.zeros(5, np.float32)
    sub = harness.subscribe(pub, expect=wrong)
    pub.publish(make_params(0))
    with pytest.raises(SnapshotMismatch, match=r"\['w'\].*float32\[4\].*|\['w'\].*\[5\]"):
        sub.get(0, timeout=10)
    ok = harness.subscribe(pub, expect=make_params(0))
    assert ok.get(0, timeout=10).version == 0


def test_metrics_report_bytes_and_acks(harness, new_pub):
    pub = new_pub()
    sub = harness.subscribe(pub, name="actor0")
    pub.publish(make_params(0))
    pub.publish(make_params(1))
    sub.get(1, timeout=10)
    nbytes = sum(a.nbytes for a in make_params(0).values())

    def acked():
        m = pub.metrics()
        return m.get("subscriber/actor0/acked_version") == 1 and m

    wait_until(acked)
    m = pub.metrics()
    assert m["latest_version"] == 1
    assert m["publish/bytes"] == nbytes
    assert m["publish/seconds/count"] == 2
    assert all(isinstance(v, (int, float)) for v in m.values())


def test_publish_and_placed_get_are_clean_under_disallow_transfer_guard(harness, new_pub):
    import jax

    devs = jax.devices()
    pub = new_pub()
    sub = harness.subscribe(pub, device=devs[1])
    params = jax.device_put(make_params(4), devs[0])
    with jax.transfer_guard("disallow"):
        version = pub.publish(params)
        snap = sub.get(version, timeout=10)
        assert snap.params["x"].devices() == {devs[1]}
    assert check_params(snap.params) == 4


@pytest.mark.timeout(120)
def test_kept_device_snapshots_never_change_while_the_publisher_races(harness, new_pub):
    """A snapshot owns its memory: a reader may keep it while later versions are written."""
    import jax

    devs = jax.devices()
    pub = new_pub(keep=1)  # the fewest slots/objects: reuse of memory comes soonest
    subs = [harness.subscribe(pub, device=devs[1 + i % 2]) for i in range(2)]
    n = 4096
    pub.publish(make_params(0, n))
    for sub in subs:
        sub.get(0, timeout=30)
    final = 60
    kept: list[list[Snapshot]] = [[] for _ in subs]
    done = threading.Event()
    errors = []

    def read(i: int) -> None:
        try:
            while not done.is_set():
                snap = subs[i].poll() or subs[i].get(
                    kept[i][-1].version + 1 if kept[i] else 0, timeout=30
                )
                kept[i].append(snap)
                if snap.version >= final:
                    return
        except Exception as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)

    readers = [threading.Thread(target=read, args=(i,)) for i in range(len(subs))]
    for t in readers:
        t.start()
    for v in range(1, final + 1):
        pub.publish(make_params(v, n))
        if v % 3 == 0:
            pub.flush(timeout=30)
    for t in readers:
        t.join(60)
    done.set()
    assert not errors, errors
    for v in range(final + 1, final + 4):  # every slot / buffer is rewritten at least once more
        pub.publish(make_params(v, n))
        pub.flush(timeout=30)
    assert all(k and k[-1].version == final for k in kept)
    for snaps in kept:
        for snap in snaps:
            assert snap.params["x"].devices() <= set(devs[1:3])
            assert check_params(snap.params) == snap.version  # unchanged since it was returned


def test_negative_versions_are_rejected(harness, new_pub):
    with pytest.raises(ValueError, match="first_version=-1"):
        harness.publisher(first_version=-1)
    pub = new_pub()
    for bad in (-3, -1):  # -1 is "none yet" to shm readers: the boundary matters
        with pytest.raises(ValueError, match=rf">= 0.*version={bad}"):
            pub.publish(make_params(0), version=bad)
    assert pub.latest_version is None
    assert pub.publish(make_params(0)) == 0
    assert harness.subscribe(pub).get(0, timeout=10).version == 0


@pytest.mark.parametrize("keep", [1, 2])
def test_a_failing_transform_fails_only_its_version(harness, new_pub, keep):
    """keep=1: version 0 is gone from the publisher once 1 is published; a subscriber that
    has 0 is still satisfied by it (it does not wait for a version >= 2 instead)."""

    def transform(params):
        if int(np.asarray(params["x"])[0]) == 1:
            raise ValueError("cannot transform version 1")
        return params

    pub = new_pub(transform=transform, keep=keep)
    sub = harness.subscribe(pub)
    pushed = []
    pub.add_push_target(lambda snap: pushed.append(snap.version), "rec")
    pub.publish(make_params(0))
    assert sub.get(0, timeout=10).version == 0
    pub.publish(make_params(1))  # never raises in the learner
    pub.flush(timeout=10)  # settles (as skipped) rather than hanging
    # Still satisfied by version 0: a get that waited for a version >= 2 instead would
    # time out, as version 2 is only published below.
    assert sub.get(0, timeout=10).version == 0
    wait_until(lambda: pub.metrics()["transform/failures"] == 1)
    with pytest.raises(SyncTimeout):
        sub.get(1, timeout=0.3)  # version 1 never appears
    assert pub.publish(make_params(2)) == 2
    snap = sub.get(1, timeout=10)
    assert snap.version == 2 and check_params(snap.params) == 2
    assert check_params(harness.subscribe(pub).get(2, timeout=10).params) == 2
    wait_until(lambda: pushed and pushed[-1] == 2)
    m = pub.metrics()
    assert m["transform/failures"] == 1 and m["transform/last_failed_version"] == 1
    assert 1 not in pushed and m["push/rec/failures"] == 0  # skipped, not a target failure


def _unlink_segments(name: str) -> None:
    from multiprocessing import shared_memory

    for seg in (name, name + "_d"):  # a killed publisher could not unlink them
        try:
            shared_memory.SharedMemory(name=seg).unlink()
        except FileNotFoundError:
            pass


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_relay_reports_its_upstream_death_downstream(harness, new_pub):
    """The upstream (an shm publisher process) is killed: an error, not a normal close."""
    import multiprocessing as mp

    from podrace.sync.base import PublisherGone
    from podrace.sync.relay import Relay
    from podrace.sync.shm_subscriber import ShmSubscriber
    from tests.sync import workers

    ctx = mp.get_context("spawn")
    names = ctx.Queue()
    proc = ctx.Process(target=workers.shm_publisher_then_hang, args=(names,), daemon=True)
    proc.start()
    name = None
    try:
        name = names.get(timeout=60)
        downstream = new_pub()
        relay = Relay(ShmSubscriber(name), downstream, name="node0")
        sub = harness.subscribe(downstream)
        assert workers.stamp_of(sub.get(0, timeout=30).params) == 0
        proc.kill()
        with pytest.raises(PublisherGone, match=r"relay 'node0'.*went away"):
            sub.get(1, timeout=30)
        with pytest.raises(PublisherGone, match="went away"):
            relay.join(10)
        assert isinstance(relay.error, PublisherGone) and not relay.running
    finally:
        proc.kill()
        proc.join(10)
        if name is not None:
            _unlink_segments(name)


def test_expect_describes_the_snapshot_as_returned(harness, new_pub):
    """One rule: `expect` is checked against what get() returns (after placement)."""
    import jax

    dev = jax.devices()[1]
    placed = jax.device_put(make_params(0), dev)
    if placed["x"].dtype == make_params(0)["x"].dtype:
        pytest.skip("jax_enable_x64 is on: placement keeps every dtype, nothing to tell apart")
    pub = new_pub()
    pub.publish(make_params(3))
    as_placed = harness.subscribe(pub, device=dev, expect=placed)
    assert check_params(as_placed.get(0, timeout=10).params) == 3
    as_published = harness.subscribe(pub, device=dev, expect=make_params(0))
    with pytest.raises(SnapshotMismatch, match=r"\['sum'\]: expected int64\[\], got int32\[\]"):
        as_published.get(0, timeout=10)


@pytest.mark.timeout(60)
def test_versions_are_integers_that_every_transport_can_carry(harness, new_pub):
    pub = new_pub()
    assert pub.publish(make_params(3), version=3) == 3
    with pytest.raises(TypeError, match="integers"):
        pub.publish(make_params(3), version=3.5)  # int(3.5) would repeat version 3
    with pytest.raises(ValueError, match="<="):
        pub.publish(make_params(4), version=2**60)  # shm packs versions into a word
    with pytest.raises(ValueError, match="<="):
        harness.publisher(first_version=2**60)
    assert pub.publish(make_params(4), version=np.int64(4)) == 4  # e.g. a step counter
    sub = harness.subscribe(pub)
    assert check_params(sub.get(4, timeout=10).params) == 4  # the channel still works
    assert pub.publish(make_params(5)) == 5
    assert sub.get(5, timeout=10).version == 5


@pytest.mark.timeout(60)
def test_get_and_flush_take_an_infinite_timeout(harness, new_pub):
    pub = new_pub()
    sub = harness.subscribe(pub)
    threading.Timer(0.2, lambda: pub.publish(make_params(0))).start()
    assert sub.get(0, timeout=float("inf")).version == 0  # threading rejects inf itself
    pub.flush(timeout=float("inf"))
    with pytest.raises(ValueError, match="NaN"):
        sub.get(1, timeout=float("nan"))  # would wait forever on shm
    with pytest.raises(SyncTimeout):
        sub.get(1, timeout=-1)


@pytest.mark.timeout(60)
def test_a_push_target_may_close_its_publisher(harness, new_pub):
    pub = new_pub()
    sub = harness.subscribe(pub)
    errors, closed = [], threading.Event()

    def evaluator(snap):  # e.g. ends the run once a version is good enough
        if snap.version == 1:
            pub.close()
            closed.set()

    pub.add_push_target(evaluator, "evaluator", on_error=lambda name, exc: errors.append(exc))
    pub.publish(make_params(0))
    pub.publish(make_params(1))
    assert closed.wait(10), errors  # close() raised "cannot join current thread" in the target
    assert errors == [] and pub.closed
    with pytest.raises(ChannelClosed):
        sub.get(2, timeout=10)


@pytest.mark.timeout(60)
def test_a_timeout_beyond_what_threads_can_wait_waits_forever(harness, new_pub):
    """threading rejects waits past TIMEOUT_MAX (about 292 years) with OverflowError."""
    pub = new_pub()
    sub = harness.subscribe(pub)
    threading.Timer(0.2, lambda: pub.publish(make_params(0))).start()
    assert sub.get(0, timeout=1e10).version == 0  # blocked first: the wait itself took 1e10
    pub.flush(timeout=1e10)
    with pytest.raises(SyncTimeout):
        sub.get(1, timeout=0.05)  # finite timeouts still time out


@pytest.mark.timeout(60)
def test_after_flush_get_of_the_flushed_version_returns_it(harness, new_pub):
    """flush() promises get(min_version=v) of the flushed v; poll() and get(0) return the
    newest version the subscriber has, which on ray may trail v for a moment."""
    pub = new_pub()
    sub = harness.subscribe(pub)
    for v in range(5):
        pub.publish(make_params(v))
        pub.flush(timeout=10)
        assert sub.get(v, timeout=10).version == v
        assert sub.get(0, timeout=10).version == v  # received now: get(0) has it too
    assert sub.poll() is None


def test_a_version_with_another_layout_is_rejected_and_the_channel_goes_on(harness, new_pub):
    """Every transport refuses a version whose shapes, dtypes or tree differ from the first,
    numbers nothing for it, and goes on."""
    pub = new_pub()
    sub = harness.subscribe(pub)
    pub.publish(make_params(0))
    grown = make_params(1, n=17)
    retyped = dict(make_params(1), w=np.arange(4, dtype=np.float64))
    for wrong, match in (
        (grown, r"\['x'\].*int64\[16\].*int64\[17\]"),
        (retyped, r"\['w'\].*float32.*float64"),
        ({"x": make_params(1)["x"]}, "tree structure"),
    ):
        with pytest.raises(SnapshotMismatch, match=match):
            pub.publish(wrong)
    assert pub.publish(make_params(1)) == 1  # nothing was numbered for the refused ones
    assert check_params(sub.get(1, timeout=10).params) == 1
