"""Record finished `podrace train ... --env.backend jax` runs as one results JSON.

For each run directory: its preset, env id, steps, the final evaluation return (the mean
of the last 3 evaluations, as benchmarks/learning.py reports), the evaluation curve, and
the training return (stochastic policy) at the start and the end of the run (the mean of
the metrics lines in the first and the last 5% of env steps) with the curve thinned, and
its env steps/s while learning (env steps over the training seconds of its last line).

    python benchmarks/jax_env_runs.py RUN_DIR [RUN_DIR ...] \\
        [--out benchmarks/results/jax_env_runs.json] [--note TEXT]

Entries are merged into an existing `--out` by (preset, env id, seed).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
from pathlib import Path

from podrace.metrics.plot import eval_curve, load_run, return_curve

FINAL_EVALS = 3
EDGE_SHARE = 0.05
CURVE_POINTS = 50


def _mean_between(steps: list[float], values: list[float], low: float, high: float):
    found = [v for s, v in zip(steps, values) if low <= s <= high and math.isfinite(v)]
    return statistics.fmean(found) if found else None


def _thin(points: list[list[float]], most: int) -> list[list[float]]:
    if len(points) <= most:
        return points
    step = (len(points) - 1) / (most - 1)
    return [points[round(i * step)] for i in range(most)]


def entry(run_dir: Path, note: str | None) -> dict:
    run = load_run(run_dir)
    e_steps, _, e_returns = eval_curve(run)
    t_steps, _, t_returns = return_curve(run)
    last = run.lines[-1]
    steps = int(last.get("env_steps", 0))
    final = e_returns[-FINAL_EVALS:]
    return {
        "preset": run.cfg.name,
        "env_id": run.cfg.env.id,
        "backend": run.cfg.env.backend,
        "seed": run.cfg.seed,
        "total_steps": run.cfg.total_steps,
        "steps": steps,
        "updates": int(last.get("version", 0)),
        "final_return": statistics.fmean(final) if final else None,
        "final_return_rule": f"mean of the last {FINAL_EVALS} evaluations (greedy policy)",
        "eval_episodes": run.cfg.eval.episodes,
        "eval_curve": [[int(s), r] for s, r in zip(e_steps, e_returns)],
        "train_return_start": _mean_between(t_steps, t_returns, 0, EDGE_SHARE * steps),
        "train_return_end": _mean_between(t_steps, t_returns, (1 - EDGE_SHARE) * steps, steps),
        "train_return_rule": "mean of the metrics lines' training-episode returns (stochastic "
        f"policy) in the first / last {EDGE_SHARE:.0%} of env steps",
        "train_curve": _thin(
            [[int(s), r] for s, r in zip(t_steps, t_returns) if math.isfinite(r)], CURVE_POINTS
        ),
        "train_s": round(float(last.get("time_s", 0.0)), 1),
        "env_steps_per_s": round(steps / float(last["time_s"]), 1) if last.get("time_s") else None,
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "note": note,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/jax_env_runs.json"))
    parser.add_argument("--note", default=None)
    args = parser.parse_args()
    runs = json.loads(args.out.read_text())["runs"] if args.out.exists() else []
    for run_dir in args.run_dirs:
        new = entry(run_dir, args.note)
        same = (new["preset"], new["env_id"], new["seed"])
        runs = [r for r in runs if (r["preset"], r["env_id"], r["seed"]) != same] + [new]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "jax_env_runs", "runs": runs}, indent=1) + "\n")
    for r in runs:
        print(
            f"{r['preset']} {r['env_id']} s{r['seed']}: {r['steps']:,} steps, final eval "
            f"{r['final_return']}, training return {r['train_return_start']} -> "
            f"{r['train_return_end']}"
        )


if __name__ == "__main__":
    main()
