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
from pathlib import Path
from typing import Any, Callable

_ROOT = Path(__file__).resolve().parents[1]
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


def bench_memcpy(params: dict[str, Any], reps: int) -> dict[str, float]:
    import numpy as np

    leaves = list(params.values())
    out = [np.empty_like(x) for x in leaves]
    fresh = median_time(lambda: copy_time(params), reps)
    prealloc = median_time(lambda: [np.copyto(o, x) for o, x in zip(out, leaves)], reps)
    return {"fresh_s": fresh, "prealloc_s": prealloc}


def summarize(samples: dict[str, list[float]], copies: list[float], warmup: int) -> dict[str, float]:
    """Medians after warm-up; ratio = median over reps of (copy time / visible time), each
    pair measured back to back so that the machine's load affects both alike."""
    out = {key: statistics.median(vals[warmup:]) for key, vals in samples.items()}
    ratios = [c / v for c, v in zip(copies[warmup:], samples["visible_s"][warmup:])]
    out["ratio_to_memcpy"] = statistics.median(ratios)
    out["memcpy_paired_s"] = statistics.median(copies[warmup:])
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
    copies = []
    for _ in range(reps + 1):
        copies.append(copy_time(params))
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


def _shm_reader(channel: str, requests: Any, replies: Any) -> None:
    from podrace.sync.shm import ShmSubscriber

    sub = ShmSubscriber(channel)
    replies.put("ready")
    while (want := requests.get()) is not None:
        snap = sub.get(want, timeout=120)
        done = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
        replies.put((snap.version, done, sub.metrics()["read/seconds/last"]))
        del snap
    sub.close()


def bench_shm(params: dict[str, Any], reps: int) -> dict[str, float]:
    from podrace.sync.shm import ShmPublisher

    ctx = mp.get_context("spawn")
    pub = ShmPublisher(keep=1)
    requests, replies = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_shm_reader, args=(pub.name, requests, replies), daemon=True)
    proc.start()
    assert replies.get(timeout=120) == "ready"
    samples: dict[str, list[float]] = {"publish_s": [], "visible_s": [], "write_s": [], "read_s": []}
    copies = []
    for rep in range(reps + 2):  # two warm-up reps fault in both slots and the reader's buffers
        copies.append(copy_time(params))
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
    requests.put(None)
    proc.join(60)
    pub.close()
    return summarize(samples, copies, warmup=2)


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

    pub = RayPublisher(keep=1)
    reader = Reader.remote(pub.subscribe())
    ray.get(reader.__ray_ready__.remote())
    samples: dict[str, list[float]] = {"publish_s": [], "visible_s": [], "put_s": [], "transfer_s": []}
    copies = []
    for rep in range(reps + 2):
        copies.append(copy_time(params))
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
    pub.close()
    ray.kill(reader)
    return summarize(samples, copies, warmup=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(_ROOT / "benchmarks" / "results" / "sync.json"), help="JSON output path")
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[1, 16, 256], help="params sizes in MB")
    parser.add_argument("--transports", nargs="+", default=["local", "shm", "ray"], help="transports to measure")
    args = parser.parse_args()
    _force_cpu_devices(2)

    import jax
    import numpy as np

    if "ray" in args.transports:
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
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
            print(f"{size_mb:>5} MB {name:>5}: publish {res['publish_s'] * 1e6:9.1f} us  visible "
                  f"{res['visible_s'] * 1e3:8.2f} ms  {res['gbps']:6.2f} GB/s  {res['ratio_to_memcpy']:6.1%} "
                  f"of memcpy (paired copy {nbytes / res['memcpy_paired_s'] / 1e9:.2f} GB/s)", flush=True)
        results.append(row)
        del params
    if "ray" in args.transports:
        ray.shutdown()

    out = {
        "benchmark": "sync",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "versions": {"jax": jax.__version__, "numpy": np.__version__,
                     "ray": __import__("ray").__version__ if "ray" in args.transports else None},
        "method": "medians after warm-up; publishes paced (each visible before the next); "
                  "ratio_to_memcpy = median of per-rep (np.copy time / visible time), the copy measured just before",
        "results": results,
    }
    big = next((r for r in results if r["size_mb"] == 256), None)
    if big is not None:
        out["targets"] = {
            "shm_ge_50pct_memcpy_at_256MB": big.get("shm", {}).get("ratio_to_memcpy", 0) >= 0.5,
            "ray_ge_25pct_memcpy_at_256MB": big.get("ray", {}).get("ratio_to_memcpy", 0) >= 0.25,
        }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
