"""podrace on an env written in JAX (gymnax CartPole-v1) against PureJaxRL, and against the
env's own raw vmapped step rate, side by side in one invocation.

Every measurement runs in a fresh child process, one after the other, `--repeats` times
interleaved (figures are medians over repeats):
  podrace     `podrace train cartpole-ppo --env.backend jax --env.id gymnax:CartPole-v1`:
              whole process wall time, import / prepare (build + compile) / train, env
              steps/s while learning, final evaluation return; the child ends as `podrace
              train` does (atexit handlers, no interpreter finalization); with `--envpool`
              also the preset as it is (envpool's CartPole-v1, `podrace_envpool`), with
              `--baseline DIR` also another checkout's podrace (`podrace_baseline`);
  purejaxrl   PureJaxRL's PPO (`purejaxrl/ppo.py` of a checkout of luchris429/purejaxrl,
              run by benchmarks/purejaxrl_child.py) on the same env with the preset's
              hyperparameters (64 envs x 8 steps, 4 epochs x 4 minibatches, lr 2.5e-3
              annealed, no entropy bonus, clip 0.2, gamma 0.99, lambda 0.95, vf 0.5, grad
              norm 0.5, a 64x64 tanh MLP): whole process, import / compile / train;
  raw         gymnax's own step (`env.step`, same-step autoreset) vmapped over the preset's
              64 envs with uniformly random actions, 500 steps per call in a `lax.scan`: the
              env's step rate with no policy on the same device.
Both trainers run at two budgets: `--steps` (500k, whole-process wall time: the paired
ratio podrace / PureJaxRL) and `--long-steps` (20M: env steps/s while learning, podrace's
over PureJaxRL's; `--long-repeats 0` leaves them out). Every child's process CPU seconds
(user + system, all its threads) are reported beside its wall time: on a shared, loaded
machine they move much less than wall time. Each trainer compiles cold (a fresh JAX
compilation cache directory per child); `--warm-cache` also runs both with a warmed cache
(podrace's default: `podrace train` keeps compiled programs across runs; PureJaxRL through
JAX_COMPILATION_CACHE_DIR).

PureJaxRL needs its own packages (distrax, gymnax 0.0.x's API, ...): `--purejaxrl DIR`
(the checkout), `--purejaxrl-pythonpath PATH` (prepended to PYTHONPATH of its child: a
directory with `pip install --target` of gymnax==0.0.9, distrax, tfp-nightly, chex, gast,
decorator, toolz, and stand-ins for brax and navix, which PureJaxRL's wrappers.py imports
but CartPole never uses), `--purejaxrl-python PY` (default: this interpreter).

    python benchmarks/jax_envs.py --purejaxrl DIR --purejaxrl-pythonpath PATH \\
        [--out benchmarks/results/jax_envs.json] [--repeats 3] [--long-steps 20000000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_START = time.perf_counter()
PRESET = "cartpole-ppo"
ENV_ID = "gymnax:CartPole-v1"
PUREJAXRL_CONFIG = {
    "LR": 2.5e-3,
    "NUM_ENVS": 64,
    "NUM_STEPS": 8,
    "UPDATE_EPOCHS": 4,
    "NUM_MINIBATCHES": 4,
    "GAMMA": 0.99,
    "GAE_LAMBDA": 0.95,
    "CLIP_EPS": 0.2,
    "ENT_COEF": 0.0,
    "VF_COEF": 0.5,
    "MAX_GRAD_NORM": 0.5,
    "ACTIVATION": "tanh",
    "ENV_NAME": "CartPole-v1",
    "ANNEAL_LR": True,
}
"""The cartpole-ppo preset's hyperparameters, in PureJaxRL's config keys."""
RAW_ENVS, RAW_STEPS, RAW_CALLS = 64, 500, 20


def podrace_child(steps: int, envpool: bool = False) -> dict:
    """The preset on gymnax's CartPole (the jax backend), or with `envpool` as it is (its
    envpool CartPole stepped by XLA custom calls in the actor's compiled rollout)."""
    from podrace.commands.train import parse_train
    from podrace.config import replace
    from podrace.runtime.xla_setup import force_cpu_devices

    cfg = parse_train([PRESET] if envpool else [PRESET, "--env.backend", "jax", "--env.id", ENV_ID])
    cfg = replace(
        cfg,
        **{
            "total_steps": steps,
            "log.console": "none",
            "log.run_dir": tempfile.mkdtemp(prefix="podrace-bench-"),
        },
    )
    force_cpu_devices(cfg.layout.cpu_devices)
    import jax

    from podrace.runtime.run import prepare

    start = time.perf_counter()
    import_s = start - _START
    run = prepare(cfg)
    prepare_s = time.perf_counter() - start
    result = run.run()
    shutil.rmtree(cfg.log.run_dir, ignore_errors=True)
    return {
        "mode": "podrace",
        "import_s": import_s,
        "prepare_s": prepare_s,
        "compile_s": result.compile_s,
        "train_s": result.train_s,
        "learn_s": result.learn_s,
        "env_steps": result.env_steps,
        "updates": result.updates,
        "sps": result.env_steps / result.learn_s,
        "final_eval_return": result.final_eval.mean_return if result.final_eval else None,
        "child_total_s": time.perf_counter() - _START,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "devices": [str(d) for d in jax.devices()],
    }


def raw_child() -> dict:
    """gymnax's vmapped step with random actions, compiled, on the default device."""
    import gymnax
    import jax

    env, params = gymnax.make("CartPole-v1")
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def run(key, state):
        def body(carry, _):
            key, state = carry
            key, act_key, step_key = jax.random.split(key, 3)
            actions = jax.random.randint(act_key, (RAW_ENVS,), 0, env.num_actions)
            _, state, reward, _, _, _ = step(
                jax.random.split(step_key, RAW_ENVS), state, actions, params
            )
            return (key, state), reward.sum()

        (key, state), rewards = jax.lax.scan(body, (key, state), None, length=RAW_STEPS)
        return key, state, rewards.sum()

    key = jax.random.key(0)
    _, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(key, RAW_ENVS), params)
    run = jax.jit(run)
    key, state, _ = jax.block_until_ready(run(key, state))  # compile
    start = time.perf_counter()
    for _ in range(RAW_CALLS):
        key, state, total = run(key, state)
    jax.block_until_ready(total)
    seconds = time.perf_counter() - start
    return {
        "mode": "raw",
        "num_envs": RAW_ENVS,
        "env_steps": RAW_ENVS * RAW_STEPS * RAW_CALLS,
        "sps": RAW_ENVS * RAW_STEPS * RAW_CALLS / seconds,
        "devices": [str(d) for d in jax.devices()],
    }


def run_child(command: list[str], pythonpath: str | None, cache: str) -> dict:
    """One child process with its own JAX compilation cache directory `cache`."""
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=cache)
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    start, cpu = time.perf_counter(), _children_cpu_s()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    whole = time.perf_counter() - start
    cpu = _children_cpu_s() - cpu
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["whole_process_s"] = whole
    result["process_cpu_s"] = cpu
    return result


def _children_cpu_s() -> float:
    """User + system CPU seconds of every child process this one has waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def median_run(runs: list[dict]) -> dict:
    """Per numeric field, the median over repeats; other fields from the first run."""
    out = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = statistics.median(r[key] for r in runs)
    out["repeats"] = len(runs)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mode", choices=("podrace", "podrace_envpool", "raw"), help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--envpool",
        action="store_true",
        help="also run the preset as it is (envpool's CartPole) at --steps: podrace's two paths",
    )
    parser.add_argument(
        "--baseline",
        default=None,
        help="also run the jax-backend podrace child from this checkout (a directory holding "
        "an older `podrace` package, e.g. from `git archive`), interleaved, at --steps",
    )
    parser.add_argument("--steps", type=int, default=500_000)
    parser.add_argument("--long-steps", type=int, default=20_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--long-repeats", type=int, default=1)
    parser.add_argument("--warm-cache", action="store_true")
    parser.add_argument("--purejaxrl", required=False, help="a checkout of luchris429/purejaxrl")
    parser.add_argument("--purejaxrl-pythonpath", default=None)
    parser.add_argument("--purejaxrl-python", default=sys.executable)
    parser.add_argument("--out", default="benchmarks/results/jax_envs.json")
    args = parser.parse_args()
    if args.mode in ("podrace", "podrace_envpool"):
        from podrace.commands.supervisor import leave

        print(json.dumps(podrace_child(args.steps, envpool=args.mode == "podrace_envpool")))
        leave(0)  # as `podrace train` ends: atexit handlers, no interpreter finalization
    if args.mode == "raw":
        print(json.dumps(raw_child()))
        return
    if not args.purejaxrl:
        parser.error("--purejaxrl DIR is needed (a checkout of luchris429/purejaxrl)")
    here = str(Path(__file__).resolve().parents[1])
    pjr_child = str(Path(__file__).with_name("purejaxrl_child.py"))

    def podrace(steps: int, cache: str, mode: str = "podrace", checkout: str = here) -> dict:
        command = [sys.executable, __file__, "--mode", mode, "--steps", str(steps)]
        return run_child(command, checkout, cache)

    def purejaxrl(steps: int, cache: str) -> dict:
        config = json.dumps({**PUREJAXRL_CONFIG, "TOTAL_TIMESTEPS": steps})
        out = run_child(
            [args.purejaxrl_python, pjr_child, args.purejaxrl, config],
            args.purejaxrl_pythonpath,
            cache,
        )
        out["env_steps"] = out["updates"] * 64 * 8
        out["sps"] = out["env_steps"] / out["train_s"]
        return out

    load, runs = [], {"raw": [], "podrace": [], "purejaxrl": []}
    runs.update({"podrace_long": [], "purejaxrl_long": []})
    if args.envpool:
        runs["podrace_envpool"] = []
    if args.baseline:
        runs["podrace_baseline"] = []
    if args.warm_cache:
        runs.update({"podrace_warm": [], "purejaxrl_warm": []})
    warm = {"podrace": tempfile.mkdtemp(), "purejaxrl": tempfile.mkdtemp()}

    caches = list(warm.values())

    def cold() -> str:
        caches.append(tempfile.mkdtemp(prefix="jax-cache-"))
        return caches[-1]

    def note(name: str, result: dict) -> None:
        runs[name].append(result)
        load.append(os.getloadavg()[0])
        print(f"{name}: {json.dumps(result)}", file=sys.stderr)

    if args.warm_cache:  # fill each trainer's cache once
        podrace(args.steps, warm["podrace"])
        purejaxrl(args.steps, warm["purejaxrl"])
    for _ in range(args.repeats):
        note("raw", run_child([sys.executable, __file__, "--mode", "raw"], here, cold()))
        note("podrace", podrace(args.steps, cold()))
        if args.envpool:
            note("podrace_envpool", podrace(args.steps, cold(), "podrace_envpool"))
        if args.baseline:
            baseline = str(Path(args.baseline).resolve())
            note("podrace_baseline", podrace(args.steps, cold(), checkout=baseline))
        note("purejaxrl", purejaxrl(args.steps, cold()))
        if args.warm_cache:
            note("podrace_warm", podrace(args.steps, warm["podrace"]))
            note("purejaxrl_warm", purejaxrl(args.steps, warm["purejaxrl"]))
    for _ in range(args.long_repeats):
        note("podrace_long", podrace(args.long_steps, cold()))
        note("purejaxrl_long", purejaxrl(args.long_steps, cold()))
    for cache in caches:
        shutil.rmtree(cache, ignore_errors=True)
    med = {name: median_run(found) for name, found in runs.items() if found}
    ratios = {
        "whole_process_podrace_over_purejaxrl": med["podrace"]["whole_process_s"]
        / med["purejaxrl"]["whole_process_s"],
        "whole_process_cpu_podrace_over_purejaxrl": med["podrace"]["process_cpu_s"]
        / med["purejaxrl"]["process_cpu_s"],
        "e2e_sps_over_raw_env": med["podrace"]["sps"] / med["raw"]["sps"],
    }
    for other in ("podrace_envpool", "podrace_baseline"):
        if other in med:
            ratios[f"whole_process_{other}_over_purejaxrl"] = (
                med[other]["whole_process_s"] / med["purejaxrl"]["whole_process_s"]
            )
            ratios[f"whole_process_cpu_{other}_over_purejaxrl"] = (
                med[other]["process_cpu_s"] / med["purejaxrl"]["process_cpu_s"]
            )
    if args.long_repeats:
        ratios["long_sps_podrace_over_purejaxrl"] = (
            med["podrace_long"]["sps"] / med["purejaxrl_long"]["sps"]
        )
        ratios["long_e2e_sps_over_raw_env"] = med["podrace_long"]["sps"] / med["raw"]["sps"]
    if args.warm_cache:
        ratios["warm_whole_process_podrace_over_purejaxrl"] = (
            med["podrace_warm"]["whole_process_s"] / med["purejaxrl_warm"]["whole_process_s"]
        )
    report = {
        "benchmark": "jax_envs",
        "env": ENV_ID,
        "preset": PRESET,
        "steps": args.steps,
        "long_steps": args.long_steps,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_avg_1min_during": load,
        },
        "purejaxrl_config": PUREJAXRL_CONFIG,
        "ratios": ratios,
        "targets": {
            "whole_process<=0.6x_purejaxrl": ratios["whole_process_podrace_over_purejaxrl"] <= 0.6,
            "long_sps>=purejaxrl": ratios["long_sps_podrace_over_purejaxrl"] >= 1.0
            if args.long_repeats
            else None,
        },
        **med,
        "runs": runs,
    }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"ratios": ratios, "targets": report["targets"]}, indent=2))


if __name__ == "__main__":
    main()
