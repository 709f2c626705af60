"""An env written in JAX (Craftax-Classic by default) stepped by itself and by podrace, side
by side on the same device: where podrace's env steps/s go, apart from learning.

Every measurement runs in a fresh child process (its own JAX compilation cache directory,
so every program compiles cold), one after the other, `--repeats` times interleaved
(figures are medians over repeats):
  raw            the env's own `step_env` vmapped over `--num-envs` envs with uniformly
                 random actions, `--scan` steps per call in a `lax.scan`, no resets (an
                 ended env steps on): the env's step rate, a ceiling for any trainer;
  podrace_step   podrace's batched step of the same envs (`DeviceEnv.xla_step()`:
                 next-step autoreset, episode ends, keys), scanned the same way with random
                 actions: the rate an actor's compiled rollout can reach before its policy;
  podrace_step_baseline  the same from another checkout (`--baseline DIR`, a directory
                 holding an older `podrace` package, e.g. from `git archive`).
Each reports the seconds its scanned program took to compile and env steps/s over
`--seconds` of stepping. With `--run-dir`, the report adds a finished `podrace train` run
of the same env: its env steps/s while learning (env steps over training seconds, from its
last metrics line) and its ratio over `raw`.

    python benchmarks/jax_env_rate.py [--env-id craftax:Craftax-Classic-Symbolic-v1] \\
        [--num-envs 64] [--repeats 2] [--baseline DIR] [--run-dir RUN_DIR] \\
        [--out benchmarks/results/craftax_rate.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(mode: str, env_id: str, num_envs: int, scan: int, seconds: float) -> dict:
    """One measurement (`raw` or `podrace_step`) in this process."""
    import jax

    from podrace.config import EnvConfig
    from podrace.envs.device_env import DeviceEnv
    from podrace.envs.jax_envs import jax_env_spec, load_jax_env
    from podrace.runtime.xla_setup import force_cpu_devices

    force_cpu_devices(1)  # as `podrace train` sets XLA up: synchronous dispatch
    loaded = load_jax_env(EnvConfig(id=env_id, backend="jax"))
    num_actions = jax_env_spec(loaded).num_actions
    if mode == "raw":
        env, params = loaded.env, loaded.params
        step = jax.vmap(lambda k, s, a: env.step_env(k, s, a, params))
        keys = jax.random.split(jax.random.key(1), num_envs)
        _, carry = jax.jit(jax.vmap(lambda k: env.reset_env(k, params)))(keys)

        def one_step(state, key):
            act_key, step_key = jax.random.split(key)
            actions = jax.random.randint(act_key, (num_envs,), 0, num_actions)
            _, state, _, done, _ = step(jax.random.split(step_key, num_envs), state, actions)
            return state, done
    else:
        envs = DeviceEnv(loaded, num_envs, seed=0)
        envs.reset()
        device_step, carry = envs.xla_step(), envs.xla_step().current

        def one_step(handle, key):
            actions = jax.random.randint(key, (num_envs,), 0, num_actions)
            handle, out = device_step(handle, actions)
            return handle, out.episode_done

    def run(carry, key):
        key, *step_keys = jax.random.split(key, scan + 1)
        carry, done = jax.lax.scan(one_step, carry, jax.numpy.stack(step_keys))
        return carry, key, done.sum()

    key = jax.random.key(2)
    start = time.perf_counter()
    run = jax.jit(run).lower(carry, key).compile()
    compile_s = time.perf_counter() - start
    carry, key, _ = jax.block_until_ready(run(carry, key))
    calls, ended, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        carry, key, done = jax.block_until_ready(run(carry, key))
        calls, ended = calls + 1, ended + int(done)
    stepped = time.perf_counter() - start
    return {
        "mode": mode,
        "compile_s": compile_s,
        "sps": num_envs * scan * calls / stepped,
        "env_steps": num_envs * scan * calls,
        "episode_ends": ended,
        "device": str(jax.devices()[0]),
    }


def run_child(args: argparse.Namespace, mode: str, checkout: str) -> dict:
    cache = tempfile.mkdtemp(prefix="jax-cache-")
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=cache, PYTHONPATH=checkout)
    command = [sys.executable, __file__, "--mode", mode, "--env-id", args.env_id]
    command += ["--num-envs", str(args.num_envs), "--scan", str(args.scan)]
    command += ["--seconds", str(args.seconds)]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    shutil.rmtree(cache, ignore_errors=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["load_avg_1min"] = os.getloadavg()[0]
    print(f"{mode}: {json.dumps(result)}", file=sys.stderr)
    return result


def training_run(run_dir: Path) -> dict:
    """A finished run's env steps/s while learning, from its last metrics line."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    config = json.loads((run_dir / "config.json").read_text())
    return {
        "run_dir": str(run_dir),
        "env_id": config["env"]["id"],
        "num_envs": config["env"]["num_envs"],
        "env_steps": int(last["env_steps"]),
        "train_s": last["time_s"],
        "sps": last["env_steps"] / last["time_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("raw", "podrace_step"), help=argparse.SUPPRESS)
    parser.add_argument("--env-id", default="craftax:Craftax-Classic-Symbolic-v1")
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--scan", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--baseline", default=None)
    parser.add_argument("--run-dir", type=Path, default=None)
    parser.add_argument("--out", default="benchmarks/results/craftax_rate.json")
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(child(args.mode, args.env_id, args.num_envs, args.scan, args.seconds)))
        return
    here = str(Path(__file__).resolve().parents[1])
    runs: dict[str, list[dict]] = {"raw": [], "podrace_step": []}
    if args.baseline:
        runs["podrace_step_baseline"] = []
    for _ in range(args.repeats):
        runs["raw"].append(run_child(args, "raw", here))
        runs["podrace_step"].append(run_child(args, "podrace_step", here))
        if args.baseline:
            baseline = str(Path(args.baseline).resolve())
            runs["podrace_step_baseline"].append(run_child(args, "podrace_step", baseline))
    med = {
        name: {key: statistics.median(r[key] for r in found) for key in ("compile_s", "sps")}
        for name, found in runs.items()
    }
    ratios = {"podrace_step_sps_over_raw": med["podrace_step"]["sps"] / med["raw"]["sps"]}
    if args.baseline:
        ratios["podrace_step_sps_over_baseline"] = (
            med["podrace_step"]["sps"] / med["podrace_step_baseline"]["sps"]
        )
    report = {
        "benchmark": "jax_env_rate",
        "env": args.env_id,
        "num_envs": args.num_envs,
        "scan": args.scan,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "medians": med,
        "ratios": ratios,
        "runs": runs,
    }
    if args.run_dir:
        report["training_run"] = training_run(args.run_dir)
        ratios["training_sps_over_raw"] = report["training_run"]["sps"] / med["raw"]["sps"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"medians": med, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
