"""CartPole PPO benchmark: the `cartpole-ppo` preset end to end, its actors alone, and raw envpool.

Every measurement runs in this one invocation, each in a fresh child process (so compile
caches and peak RSS are not shared), one after the other, `--repeats` times interleaved
(figures are medians over repeats):
  e2e         the preset trained to completion: wall-clock, compile time, env steps/s,
              final evaluation return, peak RSS, and the whole process split into
              import, prepare (build + compile), train, final eval + shutdown, and the
              rest (interpreter start and exit: whole_process_s minus what the child saw);
  actor-only  the same actors and pipeline with the learner's update replaced by a no-op
              (params are still published every batch, so actors pace exactly as in e2e);
  learner-only  the same learner with no actors: its compiled update (and batch
              preparation) run back to back on the placed trajectories it was compiled
              for (zeros: XLA:CPU's time for these dense programs does not depend on the
              values), as many updates as the preset trains;
  envpool     raw envpool stepping of the preset's env id with the preset's env count per
              actor (synchronous, random actions, no policy), with envpool's default worker
              threads and with the count podrace gives an actor (`env.num_threads`): the
              faster of the two is the ceiling for the actors;
  purejaxrl   (with --purejaxrl DIR --purejaxrl-python PY) PureJaxRL's CartPole PPO, envs
              compiled into JAX, the same 976 updates of 512 samples, whole process, in its
              own environment (benchmarks/purejaxrl_child.py).
Ratios: e2e_sps / actor_only_sps (how well the learner hides behind the actors) and each
over envpool_sps (how much of raw env speed the actor loop keeps). The actors and the
learner share the machine's cores, so e2e can reach at most `e2e_bound`: the smallest of
actor_only_sps, learner_only_sps and cores / (actor-only + learner-only CPU seconds per env
step); `e2e_over_bound` says how much of that the overlap delivers, and the target
`ratio>=0.9 reachable` whether e2e / actor-only >= 0.9 fits under the bound at all. The e2e and
actor-only children also report the cores their threads kept busy while training
(`cores_busy`) and CPU seconds per thread group (`cpu_by_thread_s`: each podrace thread by
name, `xla_pool` for XLA:CPU's intra-op pool, where compiled programs mostly run whichever
thread called them, and `other`: envpool's workers and the rest). Every child also reports
its process CPU seconds (user + system, all threads): on a shared, loaded machine the CPU
seconds per env step move much less than wall-clock rates, and `load_avg` says how loaded
the machine was. `--baseline DIR` also runs every child against another checkout (e.g.
`git archive <commit> podrace | tar -x -C DIR`), interleaved, for a before/after comparison.

    python benchmarks/cartpole_ppo.py [--out benchmarks/results/cartpole_ppo.json] [overrides...]

`--modes e2e --baseline DIR --repeats 10` runs only the end-to-end children, this checkout
and the baseline interleaved: single e2e runs on 2 cores spread by a fifth, so a
before/after claim wants many pairs (the report then has the medians and their ratio only).

`--side-by-side PRESET [PRESET ...]` also trains these presets end to end, each repeat right
after the `cartpole-ppo` children, with the same overrides: the report's `side_by_side` has
each one's e2e medians and its steps/s over `cartpole-ppo`'s (and over every other
side-by-side preset's). E.g. the recurrent policy's cost, `--modes e2e --side-by-side
cartpole-po-ppo-lstm cartpole-po-ppo`: the LSTM preset, the same without its core, and the
feed-forward `cartpole-ppo`, in one invocation.

Extra arguments are passed to the preset as `podrace train` flags (e.g. --seed 2).
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
import threading
import time
from pathlib import Path

_START = time.perf_counter()
PRESET = "cartpole-ppo"
"""The preset the children train; a side-by-side child gets its own (`--preset`)."""
ENVPOOL_STEPS = 3000
MODES = ("envpool", "e2e", "actor-only", "learner-only")


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def envpool_child(overrides: list[str]) -> dict:
    import numpy as np

    from podrace.commands.train import parse_train

    cfg = parse_train([PRESET, *overrides])
    try:
        from podrace.runtime.build import env_threads
    except ImportError:  # a --baseline checkout from before env.num_threads: envpool's default
        env_threads = lambda cfg: None  # noqa: E731
    import envpool

    n = cfg.env.num_envs
    out = {"mode": "envpool", "num_envs": n}
    for label, threads in (("default_threads", None), ("podrace_threads", env_threads(cfg))):
        kwargs = {} if threads is None else {"num_threads": threads}
        env = envpool.make(
            cfg.env.id, env_type="gymnasium", num_envs=n, batch_size=n, seed=0, **kwargs
        )
        env.reset()
        actions = np.random.default_rng(0).integers(
            0, env.action_space.n, size=(ENVPOOL_STEPS, n), dtype=np.int32
        )
        for a in actions[:100]:
            env.step(a)
        cpu0, start = cpu_s(), time.perf_counter()
        for a in actions:
            env.step(a)
        wall = time.perf_counter() - start
        steps = ENVPOOL_STEPS * n
        out[label] = {
            "num_threads": env.config["num_threads"],
            "sps": steps / wall,
            "cpu_us_per_env_step": (cpu_s() - cpu0) / steps * 1e6,
        }
        env.close()
    best = max((out["default_threads"], out["podrace_threads"]), key=lambda r: r["sps"])
    out.update(
        env_steps=ENVPOOL_STEPS * n,
        sps=best["sps"],
        cpu_us_per_env_step=best["cpu_us_per_env_step"],
    )
    return out


def thread_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) of every live thread of this process, by native id, with
    the group it counts in: a podrace thread by its Python name (actor-0, learner, ...),
    XLA:CPU's intra-op pool (where compiled programs mostly run, whichever thread called
    them), and everything else (envpool's workers, JAX's and Python's own threads)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        group = names.get(int(tid)) or ("xla_pool" if comm.startswith("tf_XLAEigen") else "other")
        out[int(tid)] = (group, (int(fields[11]) + int(fields[12])) / tick)
    return out


def cpu_by_thread(before: dict, after: dict) -> dict[str, float]:
    """CPU seconds per thread group between two `thread_cpu()` snapshots."""
    groups: dict[str, float] = {}
    for tid, (group, seconds) in after.items():
        groups[group] = groups.get(group, 0.0) + seconds - before.get(tid, (group, 0.0))[1]
    return groups


def child(mode: str, overrides: list[str]) -> dict:
    if mode == "envpool":
        return envpool_child(overrides)
    from podrace.commands.train import parse_train
    from podrace.config import replace
    from podrace.runtime.xla_setup import force_cpu_devices

    cfg = parse_train([PRESET, *overrides])
    cfg = replace(
        cfg, **{"log.console": "none", "log.run_dir": tempfile.mkdtemp(prefix="podrace-bench-")}
    )
    force_cpu_devices(cfg.layout.cpu_devices)
    import jax

    from podrace.runtime.run import prepare

    start = time.perf_counter()
    import_s = start - _START
    if mode == "learner-only":
        return learner_only(cfg, start, import_s)
    run = prepare(cfg)
    prepare_s = time.perf_counter() - start
    if mode == "actor-only":
        run.learner.update_fn = lambda state, trajs, keys: (state, keys, {"finite": True})
    # Per-thread CPU while training: the last snapshot is taken as the learner returns, and
    # each actor thread reports its own CPU as it returns (it ends before the learner).
    snapshots, actors_cpu = [thread_cpu()], {}
    learn = run.learner.run
    run.learner.run = lambda: (learn(), snapshots.append(thread_cpu()))[0]
    for actor in run.actors:

        def actor_run(loop=actor.run, name=f"actor-{actor.actor_id}"):
            try:
                loop()
            finally:
                actors_cpu[name] = time.thread_time()

        actor.run = actor_run
    cpu0 = cpu_s()
    result = run.run()
    train_cpu = cpu_s() - cpu0
    threads_cpu = dict(
        sorted({**cpu_by_thread(*snapshots), **actors_cpu}.items(), key=lambda item: -item[1])
    )
    wall = time.perf_counter() - start
    return {
        "mode": mode,
        "import_s": import_s,
        "prepare_s": prepare_s,
        "eval_and_shutdown_s": result.train_s - result.learn_s,
        "child_total_s": time.perf_counter() - _START,
        "train_cpu_s": train_cpu,
        "cpu_us_per_env_step": train_cpu / result.env_steps * 1e6,
        "wall_s": wall,
        "compile_s": result.compile_s,
        "train_s": result.train_s,
        "learn_s": result.learn_s,
        "env_steps": result.env_steps,
        "updates": result.updates,
        "sps": result.env_steps / result.learn_s,
        "cores_busy": sum(threads_cpu.values()) / result.learn_s,
        "cpu_by_thread_s": threads_cpu,
        "final_eval_return": result.final_eval.mean_return if result.final_eval else None,
        "max_policy_lag": result.max_policy_lag,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "devices": [str(d) for d in jax.devices()],
    }


def learner_only(cfg, start: float, import_s: float) -> dict:
    """The learner's compiled update, back to back, on the trajectories it was compiled for."""
    import jax

    from podrace.runtime import run as runs
    from podrace.runtime import skeleton

    compiled_for = []
    warm_up = skeleton.warm_up_learner
    skeleton.warm_up_learner = lambda learner, trajs: (
        compiled_for.append(tuple(trajs)),
        warm_up(learner, trajs),
    )
    run = runs.prepare(cfg)
    prepare_s = time.perf_counter() - start
    learner, (trajs,) = run.learner, compiled_for
    state, keys, versions = learner.state, learner.keys, [learner.version] * len(trajs)
    updates = cfg.num_updates
    cpu0, begin = cpu_s(), time.perf_counter()
    for _ in range(updates):
        batch = learner.prepare(trajs, versions)[1]  # (normalizer, batch[, finite]) in any checkout
        state, keys, metrics = learner.update_fn(state, batch, keys)
        jax.block_until_ready(state.params)
        jax.device_get(metrics)  # as the learner loop does
    wall, cpu = time.perf_counter() - begin, cpu_s() - cpu0
    env_steps = updates * cfg.steps_per_update
    return {
        "mode": "learner-only",
        "import_s": import_s,
        "prepare_s": prepare_s,
        "updates": updates,
        "env_steps": env_steps,
        "learn_s": wall,
        "sps": env_steps / wall,
        "train_cpu_s": cpu,
        "cpu_us_per_env_step": cpu / env_steps * 1e6,
        "ms_per_update": wall / updates * 1e3,
        "child_total_s": time.perf_counter() - _START,
    }


def overlap_bound(actors: dict, learner: dict, cores: int) -> float:
    """The most env steps/s actors and learner can give together on `cores` cores."""
    cpu_bound = cores * 1e6 / (actors["cpu_us_per_env_step"] + learner["cpu_us_per_env_step"])
    return min(actors["sps"], learner["sps"], cpu_bound)


def ratios_of(raw: dict, e2e: dict, actors: dict, learner: dict, bound: float) -> dict:
    """The report's ratios of one checkout's medians."""
    return {
        "e2e_over_actor_only": e2e["sps"] / actors["sps"],
        "e2e_over_envpool": e2e["sps"] / raw["sps"],
        "actor_only_over_envpool": actors["sps"] / raw["sps"],
        "e2e_cpu_per_step_over_envpool": e2e["cpu_us_per_env_step"] / raw["cpu_us_per_env_step"],
        "learner_only_over_actor_only": learner["sps"] / actors["sps"],
        "e2e_over_bound": e2e["sps"] / bound,
        "bound_over_actor_only": bound / actors["sps"],
    }


def run_child(
    mode: str,
    overrides: list[str],
    pythonpath: str | None,
    compile_cache: str | None = None,
    command: list[str] | None = None,
) -> dict:
    """One child process: this script in `mode`, or `command` (another program's run)."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    if compile_cache:  # JAX's persistent cache, as docs/getting-started.md ("Start-up time") says
        env.update(
            JAX_COMPILATION_CACHE_DIR=compile_cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0"
        )
    start = time.perf_counter()
    out = subprocess.run(
        command or [sys.executable, __file__, "--mode", mode, *overrides],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    result["whole_process_s"] = time.perf_counter() - start
    if "child_total_s" in result:
        result["interpreter_start_and_exit_s"] = result["whole_process_s"] - result["child_total_s"]
    return result


def median_run(runs: list[dict]) -> dict:
    """Per numeric field, the median over repeats (fields that are dicts of numbers, such as
    `cpu_by_thread_s`, per key); other fields from the first run."""

    def numeric(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    out = dict(runs[0])
    for key, value in runs[0].items():
        if not all(key in r for r in runs):
            continue
        if numeric(value):
            out[key] = statistics.median(r[key] for r in runs)
        elif isinstance(value, dict) and value and all(numeric(v) for v in value.values()):
            out[key] = {k: statistics.median(r[key].get(k, 0.0) for r in runs) for k in value}
    out["repeats"] = len(runs)
    return out


def machine(load: list[float]) -> dict:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_avg_1min_during": load,
    }


def partial_report(
    args: argparse.Namespace,
    modes: tuple[str, ...],
    runs: dict,
    baseline: dict,
    purejaxrl: list[dict],
    overrides: list[str],
    load: list[float],
) -> dict:
    """Medians of the children that ran (a subset of MODES), each against the baseline's."""
    report = {
        "benchmark": "cartpole_ppo",
        "preset": PRESET,
        "overrides": overrides,
        "modes": list(modes),
        "compile_cache": args.compile_cache,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": machine(load),
        **{m.replace("-", "_"): median_run(runs[m]) for m in modes},
        "purejaxrl": median_run(purejaxrl) if purejaxrl else None,
        "runs": {**runs, "purejaxrl": purejaxrl},
    }
    if args.baseline:
        medians = {m: median_run(baseline[m]) for m in modes}
        report["baseline"] = {
            "pythonpath": args.baseline,
            **{m.replace("-", "_"): medians[m] for m in modes},
            "this_over_baseline": {
                f"{m.replace('-', '_')}_sps": report[m.replace("-", "_")]["sps"] / medians[m]["sps"]
                for m in modes
            },
            "runs": baseline,
        }
    return report


def with_side_by_side(report: dict, side: dict[str, list[dict]], e2e: list[dict] | None) -> dict:
    """`report` with the side-by-side presets' e2e medians and their steps/s ratios: over the
    main preset's e2e (when it ran) and over each other side-by-side preset."""
    if not side:
        return report
    medians = {preset: median_run(results) for preset, results in side.items()}
    if e2e:
        medians = {PRESET: median_run(e2e), **medians}
    report["side_by_side"] = {
        preset: {
            "e2e": median,
            **{
                f"sps_over_{other}": median["sps"] / medians[other]["sps"]
                for other in medians
                if other != preset
            },
        }
        for preset, median in medians.items()
        if preset in side
    }
    report["runs"]["side_by_side"] = side
    return report


def side_by_side_summary(report: dict) -> dict:
    """What is printed of the side-by-side presets: steps/s, final return and ratios."""
    return {
        preset: {
            "sps": entry["e2e"]["sps"],
            "final_eval_return": entry["e2e"]["final_eval_return"],
            **{k: v for k, v in entry.items() if k.startswith("sps_over_")},
        }
        for preset, entry in report["side_by_side"].items()
    }


def write_report(out: str, report: dict) -> None:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="benchmarks/results/cartpole_ppo.json")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--pythonpath", help="PYTHONPATH of the children (another checkout, for A/B)"
    )
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        help="also run every child against the checkout in DIR, interleaved with this one "
        "(a before/after comparison under the same load); reported under 'baseline'",
    )
    parser.add_argument(
        "--compile-cache",
        metavar="DIR",
        help="children use JAX's persistent compilation cache in DIR (fill it first: run twice)",
    )
    parser.add_argument(
        "--purejaxrl",
        metavar="DIR",
        help="also run PureJaxRL's CartPole PPO from this checkout of luchris429/purejaxrl",
    )
    parser.add_argument(
        "--purejaxrl-python",
        metavar="PY",
        help="the Python of an environment with PureJaxRL's requirements (for --purejaxrl)",
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=MODES,
        default=list(MODES),
        help="run only these children (e.g. `--modes e2e --baseline DIR --repeats 10` for "
        "many before/after pairs of the end-to-end run); ratios, bound and targets need all",
    )
    parser.add_argument(
        "--side-by-side",
        nargs="+",
        default=[],
        metavar="PRESET",
        help="also train these presets end to end in every repeat (e.g. cartpole-po-ppo-lstm "
        "cartpole-po-ppo); reported under side_by_side with their steps/s ratios",
    )
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--preset", default=PRESET, help=argparse.SUPPRESS)
    args, overrides = parser.parse_known_args()
    if args.mode:
        globals()["PRESET"] = args.preset
        print(json.dumps(child(args.mode, overrides)))
        return
    if bool(args.purejaxrl) != bool(args.purejaxrl_python):
        parser.error("--purejaxrl and --purejaxrl-python go together")
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    for flag, path in (("--baseline", args.baseline), ("--pythonpath", args.pythonpath)):
        # Without a podrace package there, the children would import this checkout's
        # (the editable install) and compare it with itself.
        if path and not (Path(path) / "podrace" / "__init__.py").is_file():
            parser.error(
                f"{flag} {path}: no podrace package there (expected {Path(path) / 'podrace'})"
            )
    modes = tuple(m for m in MODES if m in args.modes)
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    baseline: dict[str, list[dict]] = {m: [] for m in modes}
    purejaxrl: list[dict] = []
    side: dict[str, list[dict]] = {p: [] for p in args.side_by_side}
    load = [os.getloadavg()[0]]
    for _ in range(args.repeats):
        for mode in modes:
            sides = [(baseline, args.baseline)] if args.baseline else []
            for into, path in [*sides, (runs, args.pythonpath)]:
                into[mode].append(run_child(mode, overrides, path, args.compile_cache))
                load.append(os.getloadavg()[0])
                print(
                    f"{mode} ({path or 'this checkout'}): {json.dumps(into[mode][-1])}",
                    file=sys.stderr,
                )
        if args.purejaxrl:
            driver = str(Path(__file__).with_name("purejaxrl_child.py"))
            purejaxrl.append(
                run_child(
                    "purejaxrl", [], None, command=[args.purejaxrl_python, driver, args.purejaxrl]
                )
            )
            load.append(os.getloadavg()[0])
            print(f"purejaxrl: {json.dumps(purejaxrl[-1])}", file=sys.stderr)
        for preset in args.side_by_side:
            side[preset].append(run_child("e2e", [*overrides, "--preset", preset], args.pythonpath))
            load.append(os.getloadavg()[0])
            print(f"e2e {preset}: {json.dumps(side[preset][-1])}", file=sys.stderr)
    if modes != MODES:
        report = partial_report(args, modes, runs, baseline, purejaxrl, overrides, load)
        write_report(args.out, with_side_by_side(report, side, runs.get("e2e")))
        if side:
            print(json.dumps(side_by_side_summary(report), indent=2))
        return
    raw, e2e, actors, learner = (median_run(runs[m]) for m in modes)
    cores = len(os.sched_getaffinity(0))
    bound = overlap_bound(actors, learner, cores)
    startup = {
        "whole_process_s": e2e["whole_process_s"],
        "import_s": e2e["import_s"],
        "compile_s": e2e["compile_s"],
        "build_s": e2e["prepare_s"] - e2e["compile_s"],
        "train_s": e2e["learn_s"],
        "final_eval_and_shutdown_s": e2e["eval_and_shutdown_s"],
        "interpreter_start_and_exit_s": e2e["interpreter_start_and_exit_s"],
    }
    pjr = median_run(purejaxrl) if purejaxrl else None
    ratios = ratios_of(raw, e2e, actors, learner, bound)
    report = {
        "benchmark": "cartpole_ppo",
        "preset": PRESET,
        "overrides": overrides,
        "compile_cache": args.compile_cache,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": machine(load),
        "envpool": raw,
        "e2e": e2e,
        "actor_only": actors,
        "learner_only": learner,
        "e2e_bound": {"cores": cores, "sps": bound},
        "ratio_e2e_over_actor_only": ratios["e2e_over_actor_only"],
        "ratios": ratios,
        "startup": startup,
        "targets": {
            "final_eval_return>=475": (e2e["final_eval_return"] or 0) >= 475,
            "wall_s<30": e2e["wall_s"] < 30,
            "peak_rss_mb<2048": e2e["peak_rss_mb"] < 2048,
            "ratio>=0.9": ratios["e2e_over_actor_only"] >= 0.9,
            "ratio>=0.9 reachable": ratios["bound_over_actor_only"] >= 0.9,
            "e2e>=0.4*envpool": ratios["e2e_over_envpool"] >= 0.4,
            "actor_only>=0.5*envpool": ratios["actor_only_over_envpool"] >= 0.5,
            "whole_process<=purejaxrl": None
            if pjr is None
            else startup["whole_process_s"] <= pjr["whole_process_s"],
        },
        "purejaxrl": pjr,
        "runs": {**runs, "purejaxrl": purejaxrl},
    }
    if pjr is not None:
        ratios["whole_process_over_purejaxrl"] = startup["whole_process_s"] / pjr["whole_process_s"]
    if args.baseline:
        b_raw, b_e2e, b_actors, b_learner = (median_run(baseline[m]) for m in modes)
        report["baseline"] = {
            "pythonpath": args.baseline,
            "envpool": b_raw,
            "e2e": b_e2e,
            "actor_only": b_actors,
            "learner_only": b_learner,
            "ratios": ratios_of(
                b_raw, b_e2e, b_actors, b_learner, overlap_bound(b_actors, b_learner, cores)
            ),
            "this_over_baseline": {
                "e2e_sps": e2e["sps"] / b_e2e["sps"],
                "actor_only_sps": actors["sps"] / b_actors["sps"],
                "e2e_cpu_per_step": e2e["cpu_us_per_env_step"] / b_e2e["cpu_us_per_env_step"],
                "actor_only_cpu_per_step": actors["cpu_us_per_env_step"]
                / b_actors["cpu_us_per_env_step"],
                "learner_only_sps": learner["sps"] / b_learner["sps"],
                "whole_process_s": e2e["whole_process_s"] / b_e2e["whole_process_s"],
            },
            "runs": baseline,
        }
    write_report(args.out, with_side_by_side(report, side, runs["e2e"]))
    print(
        json.dumps({k: report[k] for k in ("ratios", "startup", "targets", "purejaxrl")}, indent=2)
    )
    if side:
        print(json.dumps(side_by_side_summary(report), indent=2))
    if args.baseline:
        print(
            json.dumps({"this_over_baseline": report["baseline"]["this_over_baseline"]}, indent=2)
        )


if __name__ == "__main__":
    main()
