"""Weight-sync benchmark: publish cost, publish-to-visible latency and bandwidth per transport.

For params of 1, 16 and 256 MB (four float32 leaves), per transport:

* publish_s: what `publish()` costs the learner thread;
* visible_s: from the start of `publish()` until a subscriber holds the snapshot as a
  consumer would use it —
    local: an actor thread's `get()` returns it placed on another device (the one
           `device_put` per device); `local_host_visible_s` is the unplaced path;
    shm:   a subscriber in another process has its own host copy;
    ray:   a subscriber in another Ray worker has the arrays (`ray.get`);
* bandwidth = bytes / visible_s, and ratio_to_memcpy = median over reps of
  (time of a plain NumPy copy of the same bytes, `np.copy` of each leaf into fresh memory,
  measured just before that rep) / visible_s. Pairing each rep with its own copy keeps the
  ratio meaningful on a machine whose load varies; a standalone copy (fresh and into
  preallocated memory) is reported too.
* stream (shm, ray): sustained delivery while the learner publishes back to back for
  STREAM_SECONDS (the reader copies version v while the writer writes v + 1):
  versions/s, GB/s and its ratio to the median paired copy.

Publishes are paced (each waits until visible) so nothing is coalesced. Medians of `reps`
after warm-up reps.
Targets (issue 3): local publish cost independent of size apart from one placement per
device; shm >= 50% of memcpy at 256 MB; ray >= 25%.

Usage: python benchmarks/sync_bench.py [--out benchmarks/results/sync.json] [--sizes-mb 1 16 256]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]
STREAM_SECONDS = 1.5
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))


def _force_cpu_devices(n: int) -> None:
    """Several CPU devices for the local transport's placement (appended, never overwritten)."""
    flag = "--xla_force_host_platform_device_count"
    if flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" {flag}={n}").strip()


def make_params(nbytes: int, version: int = 0) -> dict[str, Any]:
    import numpy as np

    n = nbytes // 4 // 4
    return {f"w{i}": np.full((n,), float(version + i), dtype=np.float32) for i in range(4)}


def median_time(fn: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def copy_time(params: dict[str, Any]) -> float:
    """One plain NumPy copy of every leaf into fresh memory (the baseline)."""
    import numpy as np

    start = time.perf_counter()
    copies = [np.copy(x) for x in params.values()]
    elapsed = time.perf_counter() - start
    del copies
    return elapsed


class PairedCopies:
    """Both baselines, measured right before each transport rep: a copy into fresh memory
    (`np.copy`, pays page faults like any new allocation) and one into memory already
    touched (`np.copyto`, no faults: the strictest baseline)."""

    def __init__(self, params: dict[str, Any]) -> None:
        import numpy as np

        self.params = params
        self.dst = [np.ones_like(x) for x in params.values()]
        self.fresh: list[float] = []
        self.prealloc: list[float] = []

    def measure(self) -> None:
        import numpy as np

        self.fresh.append(copy_time(self.params))
        start = time.perf_counter()
        for dst, src in zip(self.dst, self.params.values()):
            np.copyto(dst, src)
        self.prealloc.append(time.perf_counter() - start)


def bench_memcpy(params: dict[str, Any], reps: int) -> dict[str, float]:
    import numpy as np

    leaves = list(params.values())
    out = [np.empty_like(x) for x in leaves]
    fresh = median_time(lambda: copy_time(params), reps)
    prealloc = median_time(lambda: [np.copyto(o, x) for o, x in zip(out, leaves)], reps)
    return {"fresh_s": fresh, "prealloc_s": prealloc}


def summarize(
    samples: dict[str, list[float]], copies: PairedCopies, warmup: int
) -> dict[str, float]:
    """Medians after warm-up; a ratio = median over reps of (copy time / visible time), each
    pair measured back to back so that the machine's load affects both alike."""
    out = {key: statistics.median(vals[warmup:]) for key, vals in samples.items()}
    visible = samples["visible_s"][warmup:]
    out["ratio_to_memcpy"] = statistics.median(
        c / v for c, v in zip(copies.fresh[warmup:], visible)
    )
    out["ratio_to_prealloc_copy"] = statistics.median(
        c / v for c, v in zip(copies.prealloc[warmup:], visible)
    )
    out["memcpy_paired_s"] = statistics.median(copies.fresh[warmup:])
    out["prealloc_copy_paired_s"] = statistics.median(copies.prealloc[warmup:])
    return out


def bench_local(params: dict[str, Any], reps: int) -> dict[str, float]:
    import jax

    from podrace.sync.local import LocalPublisher

    devs = jax.devices()
    learner_params = jax.block_until_ready(jax.device_put(params, devs[0]))
    pub = LocalPublisher()
    actor = pub.subscribe(devs[1])
    host = pub.subscribe()
    samples: dict[str, list[float]] = {"publish_s": [], "visible_s": [], "host_visible_s": []}
    copies = PairedCopies(params)
    for _ in range(reps + 1):
        copies.measure()
        start = time.perf_counter()
        v = pub.publish(learner_params)
        published = time.perf_counter()
        actor.get(v)  # the one device_put of this version for device 1
        done = time.perf_counter()
        host.get(v)  # unplaced: the published arrays themselves
        samples["publish_s"].append(published - start)
        samples["visible_s"].append(done - start)
        samples["host_visible_s"].append(published - start + time.perf_counter() - done)
    pub.close()
    return summarize(samples, copies, warmup=1)


def stream_read(sub: Any, first: int, duration: float) -> tuple[int, float]:
    """Read every version the reader can for `duration` s from `first` on; (count, seconds).

    The clock starts when `first` arrives, so the count measures steady delivery only.
    """
    snap = sub.get(first, timeout=120)
    last, count, start = snap.version, 0, time.perf_counter()
    del snap
    while time.perf_counter() - start < duration:
        snap = sub.get(last + 1, timeout=120)
        last, count = snap.version, count + 1
        del snap
    return count, time.perf_counter() - start


def publish_until(pub: Any, params: Any, done: Callable[[], bool]) -> None:
    """A learner publishing as fast as the transport delivers (each publish made visible)."""
    while not done():
        pub.publish(params)
        pub.flush(timeout=120)


def _shm_reader(channel: str, requests: Any, replies: Any) -> None:
    from podrace.sync.shm_subscriber import ShmSubscriber

    sub = ShmSubscriber(channel)
    replies.put("ready")
    while (want := requests.get()) is not None:
        if isinstance(want, tuple):  # ("stream", first version, seconds)
            replies.put(stream_read(sub, want[1], want[2]))
            continue
        snap = sub.get(want, timeout=120)
        done = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
        replies.put((snap.version, done, sub.metrics()["read/seconds/last"]))
        del snap
    sub.close()


def stream_stats(count: int, seconds: float, nbytes: int, copies: PairedCopies) -> dict[str, float]:
    throughput = count * nbytes / seconds
    return {
        "stream_versions_per_s": count / seconds,
        "stream_gbps": throughput / 1e9,
        "stream_ratio_to_memcpy": throughput * statistics.median(copies.fresh) / nbytes,
        "stream_ratio_to_prealloc_copy": throughput * statistics.median(copies.prealloc) / nbytes,
    }


def bench_shm(params: dict[str, Any], reps: int) -> dict[str, float]:
    from podrace.sync.shm import ShmPublisher

    ctx = mp.get_context("spawn")
    pub = ShmPublisher(keep=1)
    requests, replies = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_shm_reader, args=(pub.name, requests, replies), daemon=True)
    proc.start()
    assert replies.get(timeout=120) == "ready"
    samples: dict[str, list[float]] = {
        "publish_s": [],
        "visible_s": [],
        "write_s": [],
        "read_s": [],
    }
    copies = PairedCopies(params)
    for rep in range(reps + 2):  # two warm-up reps fault in both slots and the reader's buffers
        copies.measure()
        requests.put(rep)
        time.sleep(0.05)  # the reader is waiting before the publish
        start = time.perf_counter()
        pub.publish(params)
        samples["publish_s"].append(time.perf_counter() - start)
        version, done, read_s = replies.get(timeout=120)
        assert version == rep
        samples["visible_s"].append(done - start)
        samples["read_s"].append(read_s)
        samples["write_s"].append(pub.metrics()["deliver/seconds/last"])
    out = summarize(samples, copies, warmup=2)
    requests.put(("stream", reps + 3, STREAM_SECONDS))
    got: list[Any] = []

    def reader_done() -> bool:
        if not got and not replies.empty():
            got.append(replies.get())
        return bool(got)

    publish_until(pub, params, reader_done)
    out.update(stream_stats(*got[0], nbytes=sum(x.nbytes for x in params.values()), copies=copies))
    requests.put(None)
    proc.join(60)
    pub.close()
    return out


def bench_ray(params: dict[str, Any], reps: int) -> dict[str, float]:
    import ray

    from podrace.sync.ray_transport import RayPublisher

    @ray.remote(num_cpus=0)
    class Reader:
        def __init__(self, sub: Any) -> None:
            self.sub = sub

        def read(self, want: int) -> tuple[int, float, float]:
            snap = self.sub.get(want, timeout=120)
            return snap.version, time.perf_counter(), self.sub.metrics()["transfer/seconds/last"]

        def stream(self, first: int, seconds: float) -> tuple[int, float]:
            return stream_read(self.sub, first, seconds)

    pub = RayPublisher(keep=1)
    reader = Reader.remote(pub.subscribe())
    ray.get(reader.__ray_ready__.remote())
    samples: dict[str, list[float]] = {
        "publish_s": [],
        "visible_s": [],
        "put_s": [],
        "transfer_s": [],
    }
    copies = PairedCopies(params)
    for rep in range(reps + 2):
        copies.measure()
        pending = reader.read.remote(rep)
        time.sleep(0.05)
        start = time.perf_counter()
        pub.publish(params)
        samples["publish_s"].append(time.perf_counter() - start)
        version, done, transfer_s = ray.get(pending, timeout=120)
        assert version == rep
        samples["visible_s"].append(done - start)
        samples["transfer_s"].append(transfer_s)
        samples["put_s"].append(pub.metrics()["deliver/seconds/last"])
    out = summarize(samples, copies, warmup=2)
    pending = reader.stream.remote(reps + 3, STREAM_SECONDS)
    publish_until(pub, params, lambda: bool(ray.wait([pending], timeout=0)[0]))
    out.update(
        stream_stats(
            *ray.get(pending), nbytes=sum(x.nbytes for x in params.values()), copies=copies
        )
    )
    pub.close()
    ray.kill(reader)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        default=str(_ROOT / "benchmarks" / "results" / "sync.json"),
        help="JSON output path",
    )
    parser.add_argument(
        "--sizes-mb", type=int, nargs="+", default=[1, 16, 256], help="params sizes in MB"
    )
    parser.add_argument(
        "--transports", nargs="+", default=["local", "shm", "ray"], help="transports to measure"
    )
    parser.add_argument(
        "--ray-preallocate-gb",
        type=float,
        default=0.0,
        help="size Ray's object store to this many GB and fault it in at start "
        "(preallocate_plasma_memory); 0 keeps Ray's defaults",
    )
    args = parser.parse_args()
    _force_cpu_devices(2)

    import jax
    import numpy as np

    if "ray" in args.transports:
        import ray

        store = {}
        if args.ray_preallocate_gb > 0:
            store = {
                "object_store_memory": int(args.ray_preallocate_gb * (1 << 30)),
                "_system_config": {"preallocate_plasma_memory": True},
            }
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            **store,
        )
    results = []
    for size_mb in args.sizes_mb:
        nbytes = size_mb << 20
        reps = 20 if size_mb <= 4 else 10 if size_mb <= 64 else 7
        params = make_params(nbytes)
        row: dict[str, Any] = {"size_mb": size_mb, "bytes": nbytes, "reps": reps}
        row["memcpy"] = bench_memcpy(params, reps)
        row["memcpy"]["gbps"] = nbytes / row["memcpy"]["fresh_s"] / 1e9
        row["memcpy"]["prealloc_gbps"] = nbytes / row["memcpy"]["prealloc_s"] / 1e9
        for name in args.transports:
            res = {"local": bench_local, "shm": bench_shm, "ray": bench_ray}[name](params, reps)
            res["gbps"] = nbytes / res["visible_s"] / 1e9
            row[name] = res
            stream = (
                f"  stream {res['stream_gbps']:5.2f} GB/s = {res['stream_ratio_to_memcpy']:6.1%} / "
                f"{res['stream_ratio_to_prealloc_copy']:6.1%}"
                if "stream_gbps" in res
                else ""
            )
            print(
                f"{size_mb:>5} MB {name:>5}: publish {res['publish_s'] * 1e6:8.1f} us  visible "
                f"{res['visible_s'] * 1e3:8.2f} ms {res['gbps']:5.2f} GB/s = "
                f"{res['ratio_to_memcpy']:6.1%} of np.copy / "
                f"{res['ratio_to_prealloc_copy']:6.1%} of copyto{stream}",
                flush=True,
            )
        results.append(row)
        del params
    if "ray" in args.transports:
        ray.shutdown()

    out = {
        "benchmark": "sync",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "versions": {
            "jax": jax.__version__,
            "numpy": np.__version__,
            "ray": __import__("ray").__version__ if "ray" in args.transports else None,
        },
        "ray_object_store": (
            f"{args.ray_preallocate_gb} GB, preallocated"
            if args.ray_preallocate_gb > 0
            else "Ray defaults"
        ),
        "method": "medians after warm-up; publishes paced (each visible before the next); "
        "ratio_to_memcpy = median of per-rep (np.copy time / visible time), the copy measured just "
        "before; ratio_to_prealloc_copy likewise with np.copyto into touched memory; stream_* = "
        "sustained delivery while publishing back to back",
        "results": results,
    }
    big = next((r for r in results if r["size_mb"] == 256), None)
    if big is not None:
        out["targets"] = {
            f"{name}_ge_{int(goal * 100)}pct_at_256MB": {
                metric: big[name][metric] >= goal
                for metric in (
                    "ratio_to_memcpy",
                    "ratio_to_prealloc_copy",
                    "stream_ratio_to_memcpy",
                    "stream_ratio_to_prealloc_copy",
                )
            }
            for name, goal in (("shm", 0.5), ("ray", 0.25))
            if name in big
        }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
