"""Env stepping alone: Gymnasium envs in the calling thread, in Gymnasium's AsyncVectorEnv
(one process per env, observations over shared memory), and in podrace's env worker
processes (`podrace.envs.workers`: one process per part of the envs, everything over shared
memory, one byte through a pipe per step).

Each backend steps `--envs` copies of `--env-id` with random actions through the same
BatchedEnv interface the actor uses (`VectorEnvAdapter` over the vector env, or
`WorkerEnv`), for `--seconds` per round; rounds of every backend are interleaved
`--repeats` times and the medians reported, with the machine's load average, so the ratios
are measured side by side in one invocation.

    python benchmarks/env_workers.py [--envs 8 16 64] [--workers 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import gymnasium
import numpy as np

from podrace.config import EnvConfig
from podrace.envs import EnvSource, VectorEnvAdapter
from podrace.envs.workers import WorkerEnv


def make(kind: str, env_id: str, num_envs: int, workers: int):
    source = EnvSource(EnvConfig(id=env_id, backend="gymnasium"))
    if kind == "thread":
        return source.make(num_envs, 0)
    if kind == "async_vector_env":
        vec = gymnasium.make_vec(
            env_id,
            num_envs=num_envs,
            vectorization_mode="async",
            vector_kwargs={
                "shared_memory": True,
                "autoreset_mode": gymnasium.vector.AutoresetMode.NEXT_STEP,
                "copy": False,
            },
        )
        return VectorEnvAdapter(vec, 0, env_id)
    if kind == "podrace_workers":
        return WorkerEnv(source, source.spec(), num_envs, 0, workers)
    raise ValueError(kind)


def steps_per_s(env, seconds: float) -> float:
    rng = np.random.default_rng(0)
    n = env.spec.num_actions
    actions = [rng.integers(0, n, env.num_envs).astype(np.int32) for _ in range(64)]
    env.reset()
    for i in range(50):  # warm up
        env.step(actions[i % 64])
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(actions[steps % 64])
        steps += 1
    return steps * env.num_envs / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--envs", type=int, nargs="+", default=[8, 16, 64])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    kinds = ["thread", "async_vector_env", "podrace_workers"]
    rates: dict[str, dict[str, list[float]]] = {str(n): {k: [] for k in kinds} for n in args.envs}
    loads = [os.getloadavg()[0]]
    for _ in range(args.repeats):
        for n in args.envs:
            for kind in kinds:
                env = make(kind, args.env_id, n, args.workers)
                try:
                    rates[str(n)][kind].append(steps_per_s(env, args.seconds))
                finally:
                    env.close()
                loads.append(os.getloadavg()[0])
    results = {}
    for n, by_kind in rates.items():
        medians = {k: statistics.median(v) for k, v in by_kind.items()}
        results[n] = {
            "env_steps_per_s": medians,
            "all": by_kind,
            "workers_over_thread": medians["podrace_workers"] / medians["thread"],
            "workers_over_async_vector_env": medians["podrace_workers"]
            / medians["async_vector_env"],
        }
        print(
            f"{n:>4} envs: thread {medians['thread']:>9,.0f}  async_vector_env "
            f"{medians['async_vector_env']:>9,.0f}  podrace_workers({args.workers}) "
            f"{medians['podrace_workers']:>9,.0f} env steps/s"
        )
    report = {
        "benchmark": "env_workers",
        "env_id": args.env_id,
        "workers": args.workers,
        "seconds_per_round": args.seconds,
        "repeats": args.repeats,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_avg_1min_during": loads,
        },
        "results": results,
    }
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
