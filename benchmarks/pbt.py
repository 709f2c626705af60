"""Population-based training: does PBT rescue wrong hyperparameters, and what does running
members side by side cost?

learning   for each of `--seeds`: `cartpole-ppo` with `--ppo.learning-rate 2.5e-5` (100x too
           small) as a population of 4 (`--pbt.population 4`, ranked on evaluations every
           25 updates, an interval of 25k env steps), 500k env steps per member; beside it
           the same 4 runs without PBT (seeds s..s+3, the seeds the members run with), 4
           processes at once on the same cores. Reported: every member's and every run's
           final evaluation return, the best.
overhead   a population of 4 that never exploits (an interval longer than the run) against
           4 independent runs started at once, the same flags: the steps/s of all four
           together over the window where they trained (`ratio`: from the first env steps
           any of them logged to the last, polled), and for comparison the sum of each run's
           own env steps over its training seconds (`ratio_of_summed_run_rates`: it counts
           runs that did not overlap as if they had, which favours the independent runs,
           whose compiles end at different times); `--repeats` pairs, one after the other,
           and the median ratio.

Both run `podrace train` in child processes. The machine these figures come from is shared
with other work: `load_avg` (before and after) says how loaded it was; a ratio is measured
with both sides under the same load, one after the other.

    python benchmarks/pbt.py [--modes learning overhead] [--seeds 1 2 3] [--repeats 2]
        [--out benchmarks/results/pbt.json] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LEARNING_FLAGS = (
    "--ppo.learning-rate", "2.5e-5", "--eval.every-updates", "25",
    "--log.console", "none", "--log.interval-s", "0.5",
)  # fmt: skip
PBT_FLAGS = ("--pbt.population", "4", "--pbt.interval-steps", "25000")


def train(run_dir: Path, name: str, *flags: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "podrace.cli", "train", "cartpole-ppo",
               "--log.run-dir", str(run_dir), "--log.run-name", name, *flags]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def finish(procs: list[subprocess.Popen], metrics: list[Path]) -> dict:
    """Wait for `procs`, watching the metric files `metrics` meanwhile: the steps/s of all of
    them together over the window where they trained (from the first env steps any of them
    logged to the last any logged), so that runs that start or end at other times are
    counted as they overlapped."""
    first: dict[Path, tuple[float, float]] = {}
    last: dict[Path, tuple[float, float]] = {}
    while any(proc.poll() is None for proc in procs):
        now = time.time()
        for path in metrics:
            steps = _logged_steps(path)
            if steps and path not in first:
                first[path] = (now, steps)
            if steps and steps > last.get(path, (0, 0))[1]:
                last[path] = (now, steps)
        time.sleep(0.25)
    for proc in procs:
        _, err = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"podrace train failed ({proc.returncode}): {err.decode()[-2000:]}")
    start, end = min(t for t, _ in first.values()), max(t for t, _ in last.values())
    steps = sum(last[p][1] - first[p][1] for p in first)
    return {"overlap_window_s": end - start, "overlap_steps_per_s": steps / (end - start)}


def _logged_steps(path: Path) -> float:
    try:
        lines = path.read_text().splitlines()
        return float(json.loads(lines[-1]).get("env_steps", 0.0)) if lines else 0.0
    except (OSError, ValueError):
        return 0.0  # not written yet, or a line being written


def final_line(run_dir: Path) -> dict:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return json.loads(lines[-1])


def summary(run_dirs: list[Path]) -> dict:
    finals = [final_line(d) for d in run_dirs]
    returns = [f.get("eval/return") for f in finals]
    return {
        "final_eval_returns": returns,
        "best": max(r for r in returns if r is not None),
        "env_steps": [f["env_steps"] for f in finals],
        "train_s": [f["time_s"] for f in finals],
        "steps_per_s_together": sum(f["env_steps"] / f["time_s"] for f in finals),
    }


def side_by_side(work: Path, tag: str, steps: int, seed: int, pbt: tuple[str, ...]) -> dict:
    """(the population, the 4 independent runs), one after the other."""
    common = ("--total-steps", str(steps), "--seed", str(seed), *LEARNING_FLAGS)
    start = time.time()
    members = [work / f"{tag}-pbt" / f"member-{i}" for i in range(4)]
    watched = finish(
        [train(work, f"{tag}-pbt", *common, *pbt)], [m / "metrics.jsonl" for m in members]
    )
    population = {**summary(members), **watched}
    population["wall_s"] = time.time() - start
    lineage = work / f"{tag}-pbt" / "pbt.jsonl"
    population["exploits"] = len(lineage.read_text().splitlines()) if lineage.exists() else 0
    start = time.time()
    runs = [
        train(work, f"{tag}-run{i}", "--total-steps", str(steps), "--seed", str(seed + i),
              *LEARNING_FLAGS)
        for i in range(4)
    ]  # fmt: skip
    dirs = [work / f"{tag}-run{i}" for i in range(4)]
    watched = finish(runs, [d / "metrics.jsonl" for d in dirs])
    independent = {**summary(dirs), **watched}
    independent["wall_s"] = time.time() - start
    return {"population": population, "independent": independent}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", default=["learning", "overhead"])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/pbt.json")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--learning-steps", type=int, default=500_000)
    parser.add_argument("--overhead-steps", type=int, default=300_000)
    parser.add_argument("--repeats", type=int, default=2, help="overhead pairs, one by one")
    parser.add_argument("--keep", type=Path, help="keep the runs in this folder")
    args = parser.parse_args()
    report: dict = {
        "cores": len(os.sched_getaffinity(0)),
        "load_avg_before": os.getloadavg(),
        "note": "2-core machine shared with other sessions' tests and training runs",
    }
    with tempfile.TemporaryDirectory(prefix="pbt-bench-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if "learning" in args.modes:
            report["learning"] = {
                f"seed{seed}": side_by_side(
                    work, f"learn-s{seed}", args.learning_steps, seed, PBT_FLAGS
                )
                for seed in args.seeds
            }
        if "overhead" in args.modes:
            # an interval of the whole run: no member is ranked before its last update
            never = ("--pbt.population", "4", "--pbt.interval-steps", str(args.overhead_steps))
            pairs = []
            for repeat in range(args.repeats):
                result = side_by_side(work, f"over{repeat}", args.overhead_steps, 1, never)
                result["ratio"] = (
                    result["population"]["overlap_steps_per_s"]
                    / result["independent"]["overlap_steps_per_s"]
                )
                result["ratio_of_summed_run_rates"] = (
                    result["population"]["steps_per_s_together"]
                    / result["independent"]["steps_per_s_together"]
                )
                pairs.append(result)
            report["overhead"] = {
                "pairs": pairs,
                "ratio_median": statistics.median(p["ratio"] for p in pairs),
                "ratio_of_summed_run_rates_median": statistics.median(
                    p["ratio_of_summed_run_rates"] for p in pairs
                ),
            }
    report["load_avg_after"] = os.getloadavg()
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
