"""MuJoCo PPO benchmark: the `mujoco-ppo` preset (envpool HalfCheetah-v4), with and
without observation normalization and reward scaling, one child process per (variant, seed),
run one after the other.

Per run: wall-clock, compile time, env steps/s while learning, final evaluation return
(deterministic policy), and the wall-clock a full 1M-step run would take at that speed; per
variant, the mean and std over seeds. CleanRL's published result for the same
hyperparameters and budget is stored alongside; CleanRL's ppo_continuous_action normalizes
observations and scales rewards (both clipped at 10), so `normalized` is the comparable run.

    python benchmarks/halfcheetah_ppo.py [--seeds 1 2 3] [--variants plain normalized]
        [--out ...] [overrides...]

Extra arguments are passed to the preset as `podrace train` flags (e.g. --total-steps 40960
for a short speed measurement). The full comparison (3 seeds x 2 variants x 1M steps) is
the default.
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

PRESET = "mujoco-ppo"
FULL_STEPS = 1_000_000
# docs.cleanrl.dev, ppo_continuous_action.py, MuJoCo v4 table (tag pr-424): HalfCheetah-v4,
# 1M steps, mean +- std of the final episodic return over seeds.
CLEANRL = {
    "env": "HalfCheetah-v4",
    "steps": FULL_STEPS,
    "return_mean": 1442.64,
    "return_std": 46.03,
}
VARIANTS = {  # the comparable run first
    "normalized": [
        "--normalize.obs",
        "--normalize.reward",
    ],  # the preset's setting, clips 10 as in CleanRL
    "plain": ["--normalize.no-obs", "--normalize.no-reward"],
}


def child(seed: int, overrides: list[str]) -> dict:
    from podrace.commands.train import parse_train
    from podrace.config import replace
    from podrace.runtime.xla_setup import force_cpu_devices

    cfg = parse_train([PRESET, "--seed", str(seed), *overrides])
    cfg = replace(
        cfg, **{"log.console": "none", "log.run_dir": tempfile.mkdtemp(prefix="podrace-bench-")}
    )
    force_cpu_devices(cfg.layout.cpu_devices)
    import podrace

    start = time.perf_counter()
    result = podrace.train(cfg)
    sps = result.env_steps / result.learn_s
    return {
        "seed": seed,
        "wall_s": time.perf_counter() - start,
        "compile_s": result.compile_s,
        "learn_s": result.learn_s,
        "env_steps": result.env_steps,
        "updates": result.updates,
        "sps": sps,
        "expected_full_run_s": result.compile_s + FULL_STEPS / sps,
        "final_eval_return": result.final_eval.mean_return if result.final_eval else None,
        "max_policy_lag": result.max_policy_lag,
    }


def summary(runs: list[dict]) -> dict:
    """Mean and std over seeds of what a reader compares between variants."""

    def stats(key: str) -> dict | None:
        values = [r[key] for r in runs if r[key] is not None]
        if not values:
            return None
        mean = sum(values) / len(values)
        return {"mean": mean, "std": (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5}

    return {key: stats(key) for key in ("final_eval_return", "sps", "wall_s")}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="benchmarks/results/halfcheetah_ppo.json")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--child-seed", type=int, help=argparse.SUPPRESS)
    args, overrides = parser.parse_known_args()
    if args.child_seed is not None:
        print(json.dumps(child(args.child_seed, overrides)))
        return
    variants: dict[str, dict] = {}
    report = {
        "benchmark": "halfcheetah_ppo",
        "preset": PRESET,
        "overrides": overrides,
        "seeds": args.seeds,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "jax_compilation_cache_dir": os.environ.get("JAX_COMPILATION_CACHE_DIR"),
        "variants": variants,
        "cleanrl_reference": CLEANRL,
    }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    for variant in args.variants:
        runs: list[dict] = []
        variants[variant] = {"flags": VARIANTS[variant], "runs": runs}
        for seed in args.seeds:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child-seed",
                    str(seed),
                    *VARIANTS[variant],
                    *overrides,
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            runs.append({"variant": variant, **json.loads(out.strip().splitlines()[-1])})
            variants[variant]["summary"] = summary(runs)
            print(json.dumps(runs[-1]), file=sys.stderr)
            path.write_text(
                json.dumps(report, indent=2) + "\n"
            )  # after every run: a partial report survives
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
