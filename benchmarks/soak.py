"""Soak: train CartPole for a fixed wall-clock duration, sampling RSS and thread count.

    python benchmarks/soak.py [--minutes 10] [--out benchmarks/results/soak.json] [overrides...]

The run is stopped by the clock (not by total steps). After a warm-up (the first quarter
of the run), resident memory may grow by at most --rss-bound-mb and the thread count must
not grow at all; the JSON says whether both held, with every sample.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--rss-bound-mb", type=float, default=64.0)
    parser.add_argument("--out", default="benchmarks/results/soak.json")
    args, overrides = parser.parse_known_args()

    from podrace.commands.train import parse_train
    from podrace.config import replace
    from podrace.runtime.xla_setup import force_cpu_devices

    cfg = parse_train(["cartpole-ppo", *overrides])
    cfg = replace(
        cfg,
        total_steps=10**9,
        **{"log.console": "none", "log.run_dir": tempfile.mkdtemp(prefix="podrace-soak-")},
    )
    force_cpu_devices(cfg.layout.cpu_devices)
    from podrace.runtime.run import prepare

    run = prepare(cfg)
    duration = args.minutes * 60
    samples: list[dict] = []
    start = time.monotonic()

    def sample() -> None:
        while not run.lifetime.wait(args.sample_s):
            elapsed = time.monotonic() - start
            samples.append(
                {
                    "t_s": round(elapsed, 1),
                    "rss_mb": round(rss_mb(), 1),
                    "threads": threading.active_count(),
                    "env_steps": run.metrics.total("env_steps"),
                }
            )
            if elapsed >= duration:
                run.lifetime.stop("soak duration reached")

    sampler = threading.Thread(target=sample, name="soak-sampler", daemon=True)
    sampler.start()
    run.run()
    sampler.join()

    warm = [s for s in samples if s["t_s"] >= duration / 4]
    baseline = warm[: max(1, len(warm) // 4)]
    tail = warm[-max(1, len(warm) // 4) :]
    rss_growth = max(s["rss_mb"] for s in tail) - max(s["rss_mb"] for s in baseline)
    thread_growth = max(s["threads"] for s in warm) - min(s["threads"] for s in warm)
    report = {
        "benchmark": "soak",
        "minutes": args.minutes,
        "overrides": overrides,
        "env_steps": run.metrics.total("env_steps"),
        "rss_growth_after_warmup_mb": rss_growth,
        "rss_bound_mb": args.rss_bound_mb,
        "thread_growth_after_warmup": thread_growth,
        "held": rss_growth <= args.rss_bound_mb and thread_growth == 0,
        "samples": samples,
    }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=2))


if __name__ == "__main__":
    main()
