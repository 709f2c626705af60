"""CartPole PPO benchmark: the `cartpole-ppo` preset end to end, and its actors alone.

Both measurements run in this one invocation, each in a fresh child process (so compile
caches and peak RSS are not shared), one after the other:
  e2e         the preset trained to completion: wall-clock, compile time, env steps/s,
              final evaluation return, peak RSS;
  actor-only  the same actors and pipeline with the learner's update replaced by a no-op
              (params are still published every batch, so actors pace exactly as in e2e).
The ratio e2e_sps / actor_only_sps says how well the learner hides behind the actors.

    python benchmarks/cartpole_ppo.py [--out benchmarks/results/cartpole_ppo.json] [overrides...]

Extra arguments are passed to the preset as `podrace train` flags (e.g. --seed 2).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRESET = "cartpole-ppo"


def child(mode: str, overrides: list[str]) -> dict:
    from podrace.cli import force_cpu_devices, parse_train
    from podrace.config import replace

    cfg = parse_train([PRESET, *overrides])
    cfg = replace(cfg, **{"log.console": "none", "log.run_dir": tempfile.mkdtemp(prefix="podrace-bench-")})
    force_cpu_devices(cfg.layout.cpu_devices)
    import jax

    from podrace.runtime.single_host import prepare

    start = time.perf_counter()
    run = prepare(cfg)
    if mode == "actor-only":
        run.learner.update_fn = lambda state, trajs, keys: (state, keys, {"finite": True})
    result = run.run()
    wall = time.perf_counter() - start
    return {
        "mode": mode,
        "wall_s": wall,
        "compile_s": result.compile_s,
        "train_s": result.train_s,
        "learn_s": result.learn_s,
        "env_steps": result.env_steps,
        "updates": result.updates,
        "sps": result.env_steps / result.learn_s,
        "final_eval_return": result.final_eval.mean_return if result.final_eval else None,
        "max_policy_lag": result.max_policy_lag,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "devices": [str(d) for d in jax.devices()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/results/cartpole_ppo.json")
    parser.add_argument("--mode", choices=["e2e", "actor-only"], help=argparse.SUPPRESS)
    args, overrides = parser.parse_known_args()
    if args.mode:
        print(json.dumps(child(args.mode, overrides)))
        return
    runs = {}
    for mode in ("e2e", "actor-only"):
        out = subprocess.run(
            [sys.executable, __file__, "--mode", mode, *overrides], check=True, capture_output=True, text=True
        ).stdout
        runs[mode] = json.loads(out.strip().splitlines()[-1])
        print(f"{mode}: {json.dumps(runs[mode])}", file=sys.stderr)
    e2e, actors = runs["e2e"], runs["actor-only"]
    report = {
        "benchmark": "cartpole_ppo",
        "preset": PRESET,
        "overrides": overrides,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "e2e": e2e,
        "actor_only": actors,
        "ratio_e2e_over_actor_only": e2e["sps"] / actors["sps"],
        "targets": {
            "final_eval_return>=475": (e2e["final_eval_return"] or 0) >= 475,
            "wall_s<30": e2e["wall_s"] < 30,
            "peak_rss_mb<2048": e2e["peak_rss_mb"] < 2048,
            "ratio>=0.9": e2e["sps"] / actors["sps"] >= 0.9,
        },
    }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
