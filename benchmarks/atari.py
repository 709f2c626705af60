"""Atari throughput (IMPALA with the IMPALA ResNet, or PPO with the Nature CNN) on Breakout-v5,
stage by stage and end to end.

Every measurement runs in this one invocation, each in a fresh child process (no shared
compile caches, threads or allocator state), one after the other, on the `atari-impala`
or `atari-ppo` preset at benchmark sizes (below; all stated in the JSON):

  env_only      the actor threads' envs (same adapter, env settings, envs per thread and
                threads) stepped with random actions: no policy, no learner;
  actor_only    the real actors with inference and placement onto the learner device;
                the learner's update is a no-op (params are still published every batch,
                so actors pace exactly as in training);
  learner_only  the real learner (update + block + publish, `Learner.step`) on a fixed
                trajectory of the real shape, already placed on the learner mesh, fed
                through the real pipeline: no actor runs. Measured with the preset's
                scan_unroll (the minibatch loop fully unrolled) and with scan_unroll=1
                (lax.scan), fewer updates for the latter because it is much slower on CPU;
  e2e           training: actors, pipeline and learner together.

Steps/s of actor_only and e2e are steady-state: env steps consumed between the learner's
SKIP-th and last update (the first updates include filling the pipeline). The summary
gives serial = 1 / (1/actor_only + 1/learner_only), the rate if acting and learning never
overlapped, perfect_overlap = min(actor_only, learner_only), and e2e over each; and the
ratios of e2e and actor_only to env_only and of e2e to actor_only. On a
CPU-only machine actors and learner compute on the same cores, so e2e can at best match
serial there (plus whatever one stage leaves idle); perfect overlap needs separate
actor and learner devices.

    python benchmarks/atari.py [--preset atari-impala|atari-ppo] [--out FILE]
        [--updates 20] [--unroll1-updates 2] [--num-envs 4] [podrace train flags...]

--num-envs 0 keeps the preset's envs per actor thread (64: full size, for a GPU machine);
the default 4 suits two CPU cores. The JSON goes to benchmarks/results/<preset>.json
(atari_impala.json, atari_ppo.json) unless --out says otherwise. Extra arguments are
`podrace train <preset>` flags (e.g. --env.id Pong-v5).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

PRESETS = ("atari-impala", "atari-ppo")
SKIP = 2
"""Updates left out of the steady-state rates (pipeline fill, first publishes)."""


def make_config(args: argparse.Namespace, overrides: list[str], run_dir: str = "runs", **changes):
    """The preset at benchmark sizes; forces the CPU device count before JAX starts."""
    from podrace.commands.train import parse_train
    from podrace.config import replace
    from podrace.runtime.xla_setup import force_cpu_devices

    cfg = parse_train([args.preset, *overrides])
    sizes = {
        "env.num_envs": args.num_envs or cfg.env.num_envs,
        "eval.every_updates": 0,
        "log.console": "none",
        "log.run_dir": run_dir,
        "log.interval_s": 1.0,
    }
    cfg = replace(cfg, **sizes, **changes)
    cfg = replace(cfg, total_steps=args.updates * cfg.steps_per_update)
    force_cpu_devices(cfg.layout.cpu_devices)
    return cfg


def _record_updates(run) -> list[float]:
    """Timestamps of every learner update (taken after its params were published)."""
    stamps: list[float] = []
    after = run.learner.on_update

    def stamped(version: int) -> None:
        stamps.append(time.perf_counter())
        if after is not None:
            after(version)

    run.learner.on_update = stamped
    return stamps


def _steady_sps(stamps: list[float], steps_per_update: int, start: float) -> dict:
    n = len(stamps)
    out = {"updates_timed": n, "sps_overall": n * steps_per_update / (stamps[-1] - start)}
    if n > SKIP + 1:
        out["sps"] = (n - SKIP) * steps_per_update / (stamps[-1] - stamps[SKIP - 1])
    else:
        out["sps"] = out["sps_overall"]
    return out


COMPONENTS = (
    "actor/env_step",
    "actor/inference",
    "actor/device_to_host",
    "actor/to_learner",
    "actor/rollout",
    "actor/queue_put_wait",
    "actor/params_wait",
    "learner/step",
    "learner/queue_get_wait",
    "learner/publish",
    "lag/lag_mean",
)


def _record_components(run) -> dict:
    """Mean seconds per rollout / per update of each timed stage over the whole run.

    The logger's collect() resets the means every interval, so they are summed here as
    they are added: by the learner (the run's metrics) and by each actor (its Control's
    `record`, bound to the metrics when the run was built).
    """
    sums: dict[str, list[float]] = {}

    def summing(record):
        def recording(values: dict[str, float]) -> None:
            record(values)
            for name, value in values.items():
                if name in COMPONENTS:
                    total = sums.setdefault(name, [0.0, 0])
                    total[0] += value
                    total[1] += 1

        return recording

    run.metrics.add_many = summing(run.metrics.add_many)
    for actor in run.actors:
        actor.control = dataclasses.replace(actor.control, record=summing(actor.control.record))
    return sums


def _means(sums: dict[str, list[float]]) -> dict[str, float]:
    return {name: total / count for name, (total, count) in sorted(sums.items())}


def _run_threads(cfg, skip_final_eval: bool = True):
    """prepare() the run; returns (run, update timestamps, component sums) before run.run()."""
    from podrace.runtime.run import prepare

    run = prepare(cfg)
    if skip_final_eval:  # the final greedy evaluation is not training throughput
        run.evaluator.evaluate_final = lambda version: None
    return run, _record_updates(run), _record_components(run)


def mode_env_only(cfg) -> dict:
    import numpy as np

    from podrace.envs import make_env
    from podrace.runtime.build import env_threads

    steps_per_thread = cfg.num_updates * cfg.rollout_length
    # The actors' envpool worker count (`env_threads`), not envpool's default.
    env_cfg = dataclasses.replace(cfg.env, num_threads=env_threads(cfg))
    envs = [make_env(env_cfg, cfg.env.num_envs, seed=1000 + i) for i in range(cfg.num_actors)]
    num_actions = envs[0].spec.num_actions
    barrier = threading.Barrier(cfg.num_actors + 1)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            env = envs[i]
            env.reset()
            actions = np.random.default_rng(i).integers(
                0, num_actions, (steps_per_thread, cfg.env.num_envs)
            )
            barrier.wait()
            for t in range(steps_per_thread):
                env.step(actions[t].astype(np.int32))
        except BaseException as error:  # reported by the main thread
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(cfg.num_actors)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start
    for env in envs:
        env.close()
    if errors:
        raise errors[0]
    steps = steps_per_thread * cfg.env.num_envs * cfg.num_actors
    return {"env_steps": steps, "seconds": seconds, "sps": steps / seconds}


def mode_actor_only(cfg) -> dict:
    run, stamps, components = _run_threads(cfg)
    run.learner.update_fn = lambda state, trajs, keys: (state, keys, {"finite": True})
    start = time.perf_counter()
    result = run.run()
    return {
        "compile_s": result.compile_s,
        "env_steps": result.env_steps,
        **_steady_sps(stamps, cfg.steps_per_update, start),
        "components_s": _means(components),
    }


def mode_e2e(cfg) -> dict:
    run, stamps, components = _run_threads(cfg)
    start = time.perf_counter()
    result = run.run()
    return {
        "compile_s": result.compile_s,
        "env_steps": result.env_steps,
        "max_policy_lag": result.max_policy_lag,
        **_steady_sps(stamps, cfg.steps_per_update, start),
        "components_s": _means(components),
    }


def _fixed_rollouts(run, seq: int, version: int, host_traj) -> list:
    """One placed trajectory per actor, stamped for learner update `seq`."""
    import jax
    import numpy as np

    from podrace.types import Rollout

    rollouts = []
    for actor in run.actors:
        traj = actor.out.place(jax.device_put(host_traj, actor.policy.device))
        rollouts.append(
            Rollout(
                actor_id=actor.actor_id,
                seq=seq,
                policy_version=version,
                trajectory=traj,
                episode_returns=np.zeros(0),
                episode_lengths=np.zeros(0, np.int64),
                timings={},
            )
        )
    return rollouts


def mode_learner_only(cfg) -> dict:
    """`Learner.step` on ready data: the pipeline always holds the next batch."""
    import jax
    import numpy as np

    from podrace.runtime.run import prepare
    from podrace.types import Trajectory

    start = time.perf_counter()
    run = prepare(cfg)
    prepare_s = time.perf_counter() - start
    spec = run.actors[0].env.spec
    T, B = cfg.rollout_length, cfg.env.num_envs
    rng = np.random.default_rng(0)
    host = Trajectory(
        obs=rng.integers(0, 256, (T, B) + spec.obs_shape, dtype=np.uint8),
        actions=rng.integers(0, spec.num_actions, (T, B)).astype(np.int32),
        logprobs=np.full((T, B), -np.log(spec.num_actions), np.float32),
        values=np.zeros((T, B), np.float32),
        rewards=rng.choice(np.array([0.0, 1.0], np.float32), (T, B), p=[0.9, 0.1]),
        terminated=rng.random((T, B)) < 0.01,
        truncated=np.zeros((T, B), bool),
        valid=np.ones((T, B), bool),
        last_obs=rng.integers(0, 256, (B,) + spec.obs_shape, dtype=np.uint8),
        last_value=np.zeros((B,), np.float32),
    )
    learner = run.learner
    stamps = []
    start = time.perf_counter()
    for seq in range(cfg.num_updates):
        rollouts = _fixed_rollouts(run, seq, learner.version, host)
        jax.block_until_ready([r.trajectory for r in rollouts])
        for rollout in rollouts:
            run.pipeline.put(rollout)
        step_start = time.perf_counter()
        learner.step()
        stamps.append(time.perf_counter() - step_start)
    for actor in run.actors:
        actor.env.close()
    run.evaluator.env.close()
    steps = cfg.num_updates * cfg.steps_per_update
    seconds = sum(stamps)
    return {
        "prepare_s": prepare_s,
        "updates_timed": len(stamps),
        "env_steps": steps,
        "seconds": seconds,
        "sps": steps / seconds,
        "update_s": stamps,
        "scan_unroll": cfg.layout.scan_unroll,
    }


MODES = {
    "env_only": mode_env_only,
    "actor_only": mode_actor_only,
    "learner_only": mode_learner_only,
    "learner_only_unroll1": mode_learner_only,
    "e2e": mode_e2e,
}


def child(mode: str, args: argparse.Namespace, overrides: list[str]) -> dict:
    changes = {}
    if mode == "learner_only_unroll1":
        changes["layout.scan_unroll"] = 1
        args.updates = args.unroll1_updates
    cfg = make_config(args, overrides, run_dir=tempfile.mkdtemp(prefix="podrace-bench-"), **changes)
    import jax

    start = time.perf_counter()
    out = MODES[mode](cfg)
    out.update(
        mode=mode,
        wall_s=time.perf_counter() - start,
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        devices=[str(d) for d in jax.devices()],
        device_kind=jax.devices()[0].device_kind,
    )
    return out


def _cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next(
        (line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), ""
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default=PRESETS[0], choices=PRESETS)
    parser.add_argument("--out", help="default: benchmarks/results/<preset>.json")
    parser.add_argument("--updates", type=int, default=20, help="learner updates per mode")
    parser.add_argument(
        "--unroll1-updates",
        type=int,
        default=2,
        help="timed updates for learner_only with scan_unroll=1 (slow on CPU)",
    )
    parser.add_argument(
        "--num-envs", type=int, default=4, help="envs per actor thread (0: the preset's)"
    )
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument(
        "--xla-flags",
        default="",
        help="appended to XLA_FLAGS of every child, "
        "e.g. --xla-flags=--xla_cpu_multi_thread_eigen=false",
    )
    parser.add_argument("--mode", choices=list(MODES), help=argparse.SUPPRESS)
    args, overrides = parser.parse_known_args()
    if args.mode:
        print(json.dumps(child(args.mode, args, overrides)), flush=True)
        sys.stderr.flush()
        # Measured and reported: skip the interpreter's teardown, where a learner_only child
        # can abort ("terminate called ... exception not rethrown") after its result.
        os._exit(0)

    cfg = make_config(args, overrides)  # validates the overrides before any child starts
    path = Path(args.out or f"benchmarks/results/{args.preset.replace('-', '_')}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict] = {}
    failed = []
    for mode in args.modes:
        command = [
            sys.executable,
            __file__,
            "--mode",
            mode,
            "--preset",
            args.preset,
            "--updates",
            str(args.updates),
            "--unroll1-updates",
            str(args.unroll1_updates),
            "--num-envs",
            str(args.num_envs),
            *overrides,
        ]
        env = dict(os.environ)
        if args.xla_flags:
            env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {args.xla_flags}".strip()
        start = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True, cwd=_ROOT, env=env)
        if proc.returncode:  # recorded; the other modes still run
            sys.stderr.write(proc.stderr[-4000:])
            print(f"{mode} failed with exit code {proc.returncode}", file=sys.stderr)
            runs[mode] = {
                "mode": mode,
                "exit_code": proc.returncode,
                "stderr_tail": proc.stderr[-2000:],
            }
            failed.append(mode)
        else:
            runs[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
            print(
                f"{mode}: {runs[mode]['sps']:.1f} steps/s ({time.perf_counter() - start:.0f} s)",
                file=sys.stderr,
            )
        runs[mode]["child_wall_s"] = time.perf_counter() - start
        # Other processes on the machine skew the ratios; the 1-minute load average at the
        # end of each child (this benchmark alone adds about 2 on two cores) says if they did.
        runs[mode]["load_avg_1min_after"] = os.getloadavg()[0]
        # Written after every mode: a run cut short keeps what it measured.
        path.write_text(json.dumps(_report(args, overrides, cfg, runs), indent=2) + "\n")
    print(path.read_text())
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")


def _report(args: argparse.Namespace, overrides: list[str], cfg, runs: dict[str, dict]) -> dict:
    report = {
        "benchmark": "atari",
        "preset": args.preset,
        "overrides": overrides,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "cpu_model": _cpu_model(),
            "accelerator": next(
                (run["device_kind"] for run in runs.values() if "device_kind" in run), None
            ),
            "xla_flags": f"{os.environ.get('XLA_FLAGS', '')} {args.xla_flags}".strip(),
        },
        "sizes": {
            "env_id": cfg.env.id,
            "network": f"{cfg.network.torso} {list(cfg.network.hidden_sizes)}",
            "actor_threads": cfg.num_actors,
            "envs_per_thread": cfg.env.num_envs,
            "rollout_length": cfg.rollout_length,
            "num_minibatches": (cfg.impala if cfg.algo == "impala" else cfg.ppo).num_minibatches,
            "num_epochs": 1 if cfg.algo == "impala" else cfg.ppo.num_epochs,
            "steps_per_update": cfg.steps_per_update,
            "updates_per_mode": args.updates,
            "updates_learner_only_unroll1": args.unroll1_updates,
            "steady_state_skips_first_updates": SKIP,
            "preset_scan_unroll": cfg.layout.scan_unroll,
        },
        "modes": runs,
    }
    sps = {mode: run["sps"] for mode, run in runs.items() if "sps" in run}
    if {"actor_only", "learner_only", "e2e"} <= set(sps):
        serial = 1.0 / (1.0 / sps["actor_only"] + 1.0 / sps["learner_only"])
        overlap = min(sps["actor_only"], sps["learner_only"])
        report["summary"] = {
            "steps_per_s": sps,
            "serial_sps": serial,
            "perfect_overlap_sps": overlap,
            "e2e_over_serial": sps["e2e"] / serial,
            "e2e_over_perfect_overlap": sps["e2e"] / overlap,
            "targets": {"e2e>=serial": sps["e2e"] >= serial},
            # Atari rates are often quoted in frames (agent steps x frame skip), e.g. Cleanba's.
            "e2e_frames_per_s": sps["e2e"] * cfg.env.frame_skip,
        }
        if "env_only" in sps:  # the ratios benchmarks/cartpole_ppo.py reports for CartPole
            report["summary"]["ratios"] = {
                "e2e_over_env_only": sps["e2e"] / sps["env_only"],
                "actor_only_over_env_only": sps["actor_only"] / sps["env_only"],
                "e2e_over_actor_only": sps["e2e"] / sps["actor_only"],
            }
        if "learner_only_unroll1" in sps:
            report["summary"]["learner_unrolled_over_scan"] = (
                sps["learner_only"] / sps["learner_only_unroll1"]
            )
    return report


if __name__ == "__main__":
    main()
