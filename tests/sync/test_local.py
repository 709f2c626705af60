"""`local` transport specifics: placement once per (version, device), references, guards."""

from __future__ import annotations

import gc
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podrace.sync.local import LocalPublisher
from tests.sync.conftest import check_params
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


def jax_params(version: int, device: jax.Device) -> dict[str, jax.Array]:
    return jax.device_put(
        {
            "x": np.full((64,), version, np.int64),
            "w": np.arange(4, dtype=np.float32) + version,
            "sum": np.array(64 * version + 4 * version),
        },
        device,
    )


def test_one_placement_per_version_and_device_shared_by_subscribers():
    devs = jax.devices()
    assert len(devs) >= 3, "tests/conftest.py forces 4 CPU devices"
    pub = LocalPublisher()
    subs_d1 = [pub.subscribe(devs[1]) for _ in range(3)]
    sub_d2 = pub.subscribe(devs[2])
    for v in range(3):
        pub.publish(jax_params(v, devs[0]))
        snaps = [s.get(v, timeout=5) for s in subs_d1]
        assert all(s is snaps[0] for s in snaps)  # one Snapshot object, one device_put
        assert snaps[0].params["x"].devices() == {devs[1]}
        other = sub_d2.get(v, timeout=5)
        assert other.params["x"].devices() == {devs[2]} and check_params(other.params) == v
    m = pub.metrics()
    assert m["place/cpu1/seconds/count"] == 3
    assert m["place/cpu2/seconds/count"] == 3
    pub.close()


def test_device_none_returns_published_arrays_as_they_are():
    params = jax_params(0, jax.devices()[0])
    pub = LocalPublisher()
    sub = pub.subscribe()
    pub.publish(params)
    assert sub.get(0).params is params
    pub.close()


def test_consumer_loop_is_clean_under_disallow_transfer_guard():
    devs = jax.devices()
    pub = LocalPublisher(transform=lambda p: {"w": p["w"].astype(jnp.bfloat16)})
    subs = [pub.subscribe(devs[i % 4]) for i in range(4)]
    params = jax_params(1, devs[0])
    with jax.transfer_guard("disallow"):
        for _ in range(3):
            v = pub.publish(params)
            for sub in subs:
                snap = sub.get(v, timeout=5)
                assert snap.params["w"].dtype == jnp.bfloat16
                assert sub.poll() is None
    pub.close()


def test_publish_is_bookkeeping_only():
    """Nothing is transformed or placed until a consumer asks for it."""
    calls = []
    pub = LocalPublisher(transform=lambda p: calls.append(1) or p)
    sub = pub.subscribe(jax.devices()[1])
    params = jax_params(0, jax.devices()[0])
    for _ in range(10):
        pub.publish(params)
    assert calls == [] and "place/cpu1/seconds/count" not in pub.metrics()
    sub.poll()
    assert calls == [1]
    pub.close()


@pytest.mark.slow
def test_old_versions_are_released():
    pub = LocalPublisher(keep=2)
    sub = pub.subscribe()
    refs = []
    for v in range(6):
        arr = np.full((8,), v)
        refs.append(weakref.ref(arr))
        pub.publish({"x": arr})
        sub.get(v)
        del arr
    assert pub.metrics()["versions_alive"] == 2
    wait_dead(refs[:4])  # evicted versions are freed off the publishing thread
    assert refs[4]() is not None and refs[5]() is not None
    pub.close()
    wait_dead(refs)


def wait_dead(refs, timeout=10.0):
    def dead() -> bool:
        gc.collect()
        return all(r() is None for r in refs)

    wait_until(dead, timeout, lambda: "old versions still referenced", interval=0.01)


def test_subscribers_do_not_accumulate():
    pub = LocalPublisher()
    for _ in range(50):
        pub.subscribe().close()
    gc.collect()
    assert not any(k.startswith("subscriber/") for k in pub.metrics())
    pub.close()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_stress_threads_never_see_torn_or_older_snapshots():
    devs = jax.devices()
    pub = LocalPublisher(keep=2)
    n_versions, errors, counts = 3000, [], []
    done = threading.Event()

    def reader(i: int) -> None:
        sub = pub.subscribe(devs[i % len(devs)] if i % 2 else None)
        last, seen = -1, 0
        try:
            while not done.is_set() or last < n_versions - 1:
                snap = sub.get(last + 1, timeout=10) if i % 3 == 0 else sub.poll()
                if snap is None:
                    continue
                v = check_params(snap.params)
                assert v == snap.version and v > last, (v, last)
                last, seen = v, seen + 1
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        counts.append(seen)

    readers = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for t in readers:
        t.start()
    for v in range(n_versions):
        x = np.full((256,), v, np.int64)
        pub.publish(
            {"x": x, "w": np.arange(4, dtype=np.float32) + v, "sum": np.array(x.sum() + 4 * v)}
        )
    done.set()
    for t in readers:
        t.join(30)
    pub.close()
    assert not errors, errors[:3]
    assert len(counts) == 4 and all(c > 0 for c in counts)


@pytest.mark.timeout(30)
def test_a_closed_subscriber_leaves_the_metrics_and_frees_its_name():
    pub = LocalPublisher()
    old = pub.subscribe(name="actor0")
    pub.publish({"x": np.zeros(2)})
    old.get(0, timeout=5)
    old.close()  # e.g. an actor thread that restarts
    for _ in range(5):
        pub.publish({"x": np.zeros(2)})
    # no entry whose lag grows forever
    assert not any(k.startswith("subscriber/actor0/") for k in pub.metrics())
    new = pub.subscribe(name="actor0")  # not "already in use", though `old` is still referenced
    assert new.get(0, timeout=5).version == 5
    assert pub.metrics()["subscriber/actor0/acked_version"] == 5
    old.close()  # a second close must not unregister the new subscriber of that name
    assert "subscriber/actor0/acked_version" in pub.metrics()
    pub.close()
