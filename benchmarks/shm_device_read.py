"""What an shm device subscriber's read costs, given that it places a private copy.

Placing straight from the shared slot (`device_put` of views into shared memory) would let
the returned arrays alias the slot on CPU, so a kept snapshot would change when the writer
reuses the slot. A device read therefore copies the slot into a host buffer under the
seqlock, then places that copy. Per params size (four float32 leaves), medians over reps of:

* device_read_s: `ShmSubscriber(channel, device).get()` of a new version (copy + place);
* host_read_s: `ShmSubscriber(channel).get()` (copy only);
* slot_place_s: `device_put` straight from the slot (no copy; unsafe on CPU);
* memcpy_s: `np.copy` of the same bytes, measured in the same rep;

and device_read_s / slot_place_s, device_read_s / (memcpy_s + slot_place_s).
The reader runs in the publisher's process (the read path is the same in any process).

Usage: python benchmarks/shm_device_read.py [--out benchmarks/results/shm_device_read.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))


def _force_cpu_devices(n: int) -> None:
    flag = "--xla_force_host_platform_device_count"
    if flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" {flag}={n}").strip()


def measure(size_mb: int, reps: int) -> dict[str, float]:
    import jax
    import numpy as np

    from podrace.sync.shm import ShmPublisher
    from podrace.sync.shm_layout import SlotReader
    from podrace.sync.shm_subscriber import ShmSubscriber

    n = size_mb * 2**20 // 16
    device = jax.devices()[-1]
    pub = ShmPublisher(keep=1)
    dev_sub, host_sub = ShmSubscriber(pub.name, device), ShmSubscriber(pub.name)
    raw = SlotReader(pub.name)
    samples: dict[str, list[float]] = {
        k: [] for k in ("device_read_s", "host_read_s", "slot_place_s", "memcpy_s")
    }
    for v in range(reps + 2):  # two warm-up reps: slots, buffers and compilation
        params = {f"w{i}": np.full((n,), float(v + i), np.float32) for i in range(4)}
        pub.publish(params)
        pub.flush(timeout=120)
        start = time.perf_counter()
        for leaf in params.values():
            np.copy(leaf)
        memcpy = time.perf_counter() - start
        dev_snap = dev_sub.get(v, timeout=120)
        host_snap = host_sub.get(v, timeout=120)
        start = time.perf_counter()
        got = raw.read(
            lambda slot: jax.block_until_ready(jax.device_put(raw.layout.views(slot), device)), 64
        )
        slot_place = time.perf_counter() - start
        assert got is not None and got[0] == v
        if v >= 2:
            samples["device_read_s"].append(dev_sub.metrics()["read/seconds/last"])
            samples["host_read_s"].append(host_sub.metrics()["read/seconds/last"])
            samples["slot_place_s"].append(slot_place)
            samples["memcpy_s"].append(memcpy)
        del dev_snap, host_snap, got
    raw.close()
    dev_sub.close()
    host_sub.close()
    pub.close()
    out = {k: statistics.median(x) for k, x in samples.items()}
    out["device_read_over_slot_place"] = out["device_read_s"] / out["slot_place_s"]
    out["device_read_over_memcpy_plus_slot_place"] = out["device_read_s"] / (
        out["memcpy_s"] + out["slot_place_s"]
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        default=str(_ROOT / "benchmarks" / "results" / "shm_device_read.json"),
        help="JSON output path",
    )
    parser.add_argument(
        "--sizes-mb", type=int, nargs="+", default=[1, 16, 64], help="params sizes in MB"
    )
    parser.add_argument("--reps", type=int, default=15, help="measured reps per size")
    args = parser.parse_args()
    _force_cpu_devices(2)
    import jax

    results = {f"{mb}MB": measure(mb, args.reps) for mb in args.sizes_mb}
    report = {
        "benchmark": "shm_device_read",
        "jax": jax.__version__,
        "device": str(jax.devices()[-1]),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "reps": args.reps,
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
