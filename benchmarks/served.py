"""Env workers and the inference server against today's actor threads, side by side.

Every variant trains a preset in a fresh child process (`prepare` + `run`, as `podrace
train` does), the variants interleaved `--repeats` times (figures are medians), in two
modes:
  e2e         the run as it is: env steps per second from the threads' start until the
              last update was published (`learn_s`);
  actor-only  the learner's update replaced by a no-op (params are still published every
              batch, so actors pace as in e2e): what the acting side alone delivers.

Suites (one invocation measures one suite's variants together):
  cartpole  `cartpole-ppo` with the Gymnasium backend (pure-Python CartPole, 64 envs):
            today's one actor thread, two actor threads of 32 envs, and one actor whose
            envs step in 2 worker processes with its own inference thread;
  acrobot   the same variants on `Acrobot-v1` (Gymnasium backend), a pure-Python env whose
            step (an RK4 integration, ~5x CartPole's) is the acting side's main cost, and
            its 2 worker processes served by an inference server thread (which infers for
            one worker's envs while the other's step);
  acrobot_x4, acrobot_x16  Acrobot integrated in 4 or 16 RK4 steps per env step
            (`benchmarks/python_envs.py`): a pure-Python env whose step costs about 4 or
            16 times Acrobot's, as a user's own simulator may; one actor thread against 2
            env worker processes;
  cartpole_envpool  the preset as it is (envpool, whose rollouts compile into XLA calls)
            against its envs in 2 worker processes;
  atari     `atari-impala` (envpool Breakout, IMPALA ResNet, 2 actors x 64 envs): today's
            actor threads (compiled envpool rollouts), and the same actors' envs in worker
            processes (1 per actor) served by one inference server on the actor device.
Each child reports its process CPU seconds and peak resident memory; `load_avg` says how
loaded the machine was.

    python benchmarks/served.py --suite cartpole [--repeats 3] [--out FILE] [flags...]

Extra flags go to every variant as `podrace train` flags.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GYMNASIUM = ["--env.backend", "gymnasium", "--eval.episodes", "2", "--eval.num-envs", "2"]
"""The flags every pure-Python suite shares: Gymnasium's envs, a short final evaluation."""

SUITES = {
    "cartpole": {
        "preset": "cartpole-ppo",
        "common": GYMNASIUM,
        "steps": {"e2e": 200_000, "actor-only": 200_000},
        "variants": {
            "threads_1x64": [],
            "threads_2x32": ["--layout.actors-per-device", "2", "--env.num-envs", "32"],
            "workers_2_actor": ["--env.workers", "2"],
        },
    },
    "acrobot": {
        "preset": "cartpole-ppo",
        "common": ["--env.id", "Acrobot-v1", *GYMNASIUM],
        "steps": {"e2e": 300_000, "actor-only": 300_000},
        "variants": {
            "threads_1x64": [],
            "threads_2x32": ["--layout.actors-per-device", "2", "--env.num-envs", "32"],
            "workers_2_actor": ["--env.workers", "2"],
            "workers_2_server": ["--env.workers", "2", "--layout.inference", "server"],
        },
    },
    **{
        f"acrobot_x{substeps}": {
            "preset": "cartpole-ppo",
            "common": [
                "--env.id",
                f"benchmarks.python_envs:AcrobotSubsteps{substeps}-v1",
                *GYMNASIUM,
            ],
            "steps": {"e2e": steps, "actor-only": steps},
            "variants": {
                "threads_1x64": [],
                "workers_2_actor": ["--env.workers", "2"],
            },
        }
        for substeps, steps in ((4, 100_000), (16, 30_000))
    },
    "cartpole_envpool": {
        "preset": "cartpole-ppo",
        "common": ["--eval.episodes", "2", "--eval.num-envs", "2"],
        "steps": {"e2e": 200_000, "actor-only": 200_000},
        "variants": {
            "threads_compiled": [],
            "workers_2_actor": ["--env.workers", "2"],
        },
    },
    "atari": {
        "preset": "atari-impala",
        "common": ["--eval.episodes", "1", "--eval.num-envs", "1"],
        "steps": {"e2e": 2 * 64 * 20 * 6, "actor-only": 2 * 64 * 20 * 8},
        "variants": {
            "threads": [],
            "workers_1_server": ["--env.workers", "1", "--layout.inference", "server"],
        },
    },
}


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime


def max_rss_mb() -> dict[str, float]:
    """Peak resident memory of this process and of its largest reaped child (workers)."""
    return {
        who: resource.getrusage(which).ru_maxrss / 1024  # kB on Linux
        for who, which in (("self", resource.RUSAGE_SELF), ("child", resource.RUSAGE_CHILDREN))
    }


def child(mode: str, preset: str, flags: list[str]) -> dict:
    from podrace.commands.train import parse_train
    from podrace.config import replace
    from podrace.runtime.xla_setup import force_cpu_devices

    cfg = parse_train([preset, *flags])
    cfg = replace(
        cfg, **{"log.console": "none", "log.run_dir": tempfile.mkdtemp(prefix="podrace-bench-")}
    )
    force_cpu_devices(cfg.layout.cpu_devices)
    from podrace.runtime.run import prepare

    start = time.perf_counter()
    run = prepare(cfg)
    prepare_s = time.perf_counter() - start
    if mode == "actor-only":
        run.learner.update_fn = lambda state, trajs, keys: (state, keys, {"finite": True})
    cpu0 = cpu_s()
    result = run.run()
    return {
        "mode": mode,
        "prepare_s": prepare_s,
        "learn_s": result.learn_s,
        "env_steps": result.env_steps,
        "sps": result.env_steps / result.learn_s,
        "cpu_s": cpu_s() - cpu0,
        "max_rss_mb": max_rss_mb(),
        "final_eval": None if result.final_eval is None else result.final_eval.mean_return,
        "load_avg_1min": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="cartpole")
    parser.add_argument("--modes", nargs="+", default=["e2e", "actor-only"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args, extra = parser.parse_known_args()
    suite = SUITES[args.suite]
    if args.child:
        mode, variant = args.child
        flags = [*suite["common"], *suite["variants"][variant], *extra]
        flags += ["--total-steps", str(suite["steps"][mode])]
        print(json.dumps(child(mode, suite["preset"], flags)))
        return
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    results: dict[str, dict[str, list[dict]]] = {
        m: {v: [] for v in suite["variants"]} for m in args.modes
    }
    loads = [os.getloadavg()[0]]
    for repeat in range(args.repeats):
        for mode in args.modes:
            for variant in suite["variants"]:
                done = subprocess.run(
                    [sys.executable, __file__, "--suite", args.suite, "--child", mode, variant]
                    + extra,
                    env=env,
                    capture_output=True,
                    text=True,
                )
                if done.returncode != 0:
                    raise SystemExit(f"{mode} {variant} failed:\n{done.stderr[-3000:]}")
                row = json.loads(done.stdout.strip().splitlines()[-1])
                results[mode][variant].append(row)
                loads.append(os.getloadavg()[0])
                print(
                    f"[{repeat}] {mode:>10} {variant:>18}: {row['sps']:>9,.0f} env steps/s "
                    f"(load {row['load_avg_1min']:.1f})",
                    flush=True,
                )
    summary = {}
    for mode, by_variant in results.items():
        medians = {v: statistics.median(r["sps"] for r in rows) for v, rows in by_variant.items()}
        first = next(iter(medians))
        summary[mode] = {
            "sps_median": medians,
            f"over_{first}": {v: s / medians[first] for v, s in medians.items()},
        }
    print(json.dumps(summary, indent=2))
    if args.out:
        report = {
            "benchmark": "served",
            "suite": args.suite,
            "preset": suite["preset"],
            "variants": {v: suite["common"] + f for v, f in suite["variants"].items()},
            "extra_flags": extra,
            "repeats": args.repeats,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "machine": {
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "load_avg_1min_during": loads,
            },
            "summary": summary,
            "runs": results,
        }
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
