"""What a user sees from a preset: `podrace train` as it is, then `podrace eval` of the final
checkpoint over enough episodes; the figures docs/guides/recurrent.md states.

Each (preset, seed) run is trained with the `podrace` command, then evaluated with
`podrace eval RUN --episodes N`; recorded per run: the env steps/s of its last metrics line,
the evaluations it made while training, its final checkpoint's `podrace eval` returns, and
the machine's load average before and after. Runs go one after another (they are not side
by side: compare rates only within one invocation, under its load).

    python benchmarks/train_and_eval.py cartpole-po-ppo-lstm --seeds 1 2 3 --episodes 64 \\
        [--run-dir DIR] [--out FILE]
    python benchmarks/train_and_eval.py --collect RUN_DIR [RUN_DIR ...] [--out FILE]

`--collect` records runs trained and evaluated before (the same fields, loads unknown).
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


def podrace(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "podrace.cli", *args], check=True)


def collect(run_dir: Path, load: tuple | None = None) -> dict:
    """One trained and evaluated run's figures."""
    config = json.loads((run_dir / "config.json").read_text())
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = {int(d["eval/version"]): d["eval/return"] for d in lines if "eval/return" in d}
    [evaluated] = sorted(run_dir.glob("eval-*.json"), key=lambda p: int(p.stem.split("-")[1]))[-1:]
    result = json.loads(evaluated.read_text())
    return {
        "run": run_dir.name,
        "preset": config["name"],
        "seed": config["seed"],
        "env_steps": lines[-1]["env_steps"],
        "env_steps_per_s": lines[-1]["sps"],
        "evals_while_training": {str(k): round(v, 2) for k, v in sorted(evals.items())},
        "final_eval": round(evals[max(evals)], 2),
        "podrace_eval": {
            "checkpoint": result["checkpoint"],
            "episodes": result["episodes"],
            "return": result["return"],
        },
        "load_average_before_after": load,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", nargs="?")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--run-dir", type=Path, default=None)
    parser.add_argument("--collect", type=Path, nargs="+", default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    runs = []
    if args.collect:
        runs = [collect(run_dir) for run_dir in args.collect]
    else:
        root = args.run_dir or Path(tempfile.mkdtemp(prefix="train-and-eval-"))
        for seed in args.seeds:
            name = f"{args.preset}-s{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
            before = os.getloadavg()
            podrace("train", args.preset, "--seed", str(seed), "--log.run-dir", str(root),
                    "--log.run-name", name)  # fmt: skip
            after = os.getloadavg()
            podrace("eval", str(root / name), "--episodes", str(args.episodes))
            runs.append(collect(root / name, (before, after)))
    report = {
        "benchmark": "train_and_eval",
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "runs": runs,
    }
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
