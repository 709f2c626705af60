"""Ray runtime benchmark: CartPole PPO with 2 Ray workers against the thread runtime.

All runs happen in this one invocation, each in a fresh child process, one after the other:
  threads-T     `cartpole-ppo` with 2 actor threads (ENVS envs each) and rollout length T,
                env steps/s while learning; T = 8 (the preset's) and T = 32;
  ray-T         the same run with 2 Ray workers instead of the threads (a private local Ray);
  ray-actors-N  N Ray workers (T = 8) with the learner's update replaced by a no-op (params
                are still published every batch): what the workers and the Ray sink deliver
                alone, for N = 1 and 2 (how it scales).
Steps/s count env steps consumed by the learner divided by the seconds from starting the
loops to the last update (compile and Ray start-up excluded; reported apart).
`ray_over_threads` is the ratio the issue asks for (target on 2 cores: >= 0.7), at T = 8 and
T = 32 (a Ray worker pays a fixed cost per rollout and per weight update); the
object-store bytes are those in use when training ended (workers still alive) and the
largest value sampled at each metrics line during the run.

    python benchmarks/ray_runtime.py [--out benchmarks/results/ray_runtime.json] [--steps N]
        [flags...]

Extra arguments are passed to every run as `podrace train` flags.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRESET = "cartpole-ppo"
ENVS = 32


def child(mode: str, steps: int, overrides: list[str]) -> dict:
    from podrace.commands.train import parse_train
    from podrace.runtime.xla_setup import force_cpu_devices

    kind, _, n = mode.rpartition("-")
    common = [
        PRESET,
        "--total-steps",
        str(steps),
        "--env.num-envs",
        str(ENVS),
        "--log.console",
        "none",
        "--log.run-dir",
        tempfile.mkdtemp(prefix="podrace-bench-"),
        "--eval.episodes",
        "8",
        "--rollout-length",
        n if kind != "ray-actors" else "8",
    ]
    if kind == "threads":
        flags = ["--layout.actors-per-device", "2"]
    else:
        workers = 2 if kind == "ray" else int(n)
        flags = ["--runtime", "ray", "--ray.num-workers", str(workers)]
        os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    cfg = parse_train(common + flags + overrides)
    force_cpu_devices(cfg.layout.cpu_devices)
    if kind == "threads":
        from podrace.runtime.run import prepare
    else:
        from podrace.runtime.ray.topology import prepare

    start = time.perf_counter()
    run = prepare(cfg)
    if mode.startswith("ray-actors"):
        run.learner.update_fn = lambda state, trajs, keys: (state, keys, {"finite": True})
    result = run.run()
    out = {
        "mode": mode,
        "wall_s": time.perf_counter() - start,
        "compile_s": result.compile_s,
        "learn_s": result.learn_s,
        "env_steps": result.env_steps,
        "updates": result.updates,
        "sps": result.env_steps / result.learn_s,
        "final_eval_return": result.final_eval.mean_return if result.final_eval else None,
        "max_policy_lag": result.max_policy_lag,
    }
    if kind != "threads":
        lines = [
            json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()
        ]
        out.update(
            object_store_bytes_end=result.object_store_bytes,
            object_store_bytes_max=max(line.get("ray/object_store_bytes", -1) for line in lines),
            restarts=result.restarts,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="benchmarks/results/ray_runtime.json")
    parser.add_argument("--steps", type=int, default=200_000, help="env steps per run")
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args, overrides = parser.parse_known_args()
    if args.mode:
        print(json.dumps(child(args.mode, args.steps, overrides)))
        return
    runs = {}
    for mode in ("threads-8", "ray-8", "threads-32", "ray-32", "ray-actors-1", "ray-actors-2"):
        done = subprocess.run(
            [sys.executable, __file__, "--mode", mode, "--steps", str(args.steps), *overrides],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            sys.exit(f"{mode} failed:\n{done.stderr[-4000:]}")
        runs[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{mode}: {json.dumps(runs[mode])}", file=sys.stderr)
    ratio = {t: runs[f"ray-{t}"]["sps"] / runs[f"threads-{t}"]["sps"] for t in ("8", "32")}
    report = {
        "benchmark": "ray_runtime",
        "preset": PRESET,
        "envs_per_actor": ENVS,
        "steps": args.steps,
        "overrides": overrides,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "runs": runs,
        "ray_over_threads": {f"T={t}": r for t, r in ratio.items()},
        "actor_only_sps": {"1": runs["ray-actors-1"]["sps"], "2": runs["ray-actors-2"]["sps"]},
        "actor_only_scaling_2_over_1": runs["ray-actors-2"]["sps"] / runs["ray-actors-1"]["sps"],
        "object_store_bytes_end": runs["ray-8"]["object_store_bytes_end"],
        "object_store_bytes_max_during_run": runs["ray-8"]["object_store_bytes_max"],
        "load_average_at_end": os.getloadavg(),
        "targets": {f"ray_over_threads(T={t})>=0.7": r >= 0.7 for t, r in ratio.items()},
    }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
