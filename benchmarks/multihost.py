"""Multi-host learners: CartPole PPO on 1 process with 2 learner devices vs 2 processes
with 1 learner device each (jax.distributed, gloo), one after the other in this invocation.

Both layouts have the same global batch: 2 actor threads x N envs (one per process in the
2-process layout) and 2 learner shards. For each it measures:
  sps                    env steps per second while learning (env_steps / learn_s);
  learner_step_s         mean learner update time (from metrics.jsonl);
  allreduce_s            median time of one all-reduce of a params-sized tree over the
                         learner mesh (2 local devices, or 2 processes over gloo), measured
                         apart from training just before it starts;
  allreduces_per_update  gradient all-reduces per update (epochs x minibatches);
  bytes_allreduced_per_update  params bytes x allreduces_per_update (gradients only; the
                         handful of scalar statistics reduced alongside are not counted);
  allreduce_s_per_update allreduce_s x allreduces_per_update, and its share of the step;
  scalar_allreduce_s     median time of one scalar all-reduce (latency);
  hlo_allreduce_ops      all-reduce ops in the compiled update (nearly all inside the
                         minibatch loop: gradients plus the global statistics PPO reduces);
  collective_s_per_update_estimate  allreduces_per_update x (allreduce_s + (hlo_allreduce_ops
                         - 1) x scalar_allreduce_s): all-reduce time per update, estimated.
and the ratio of the 2-process sps to the 1-process sps.

    python benchmarks/multihost.py [--out benchmarks/results/multihost.json]
        [--total-steps N] [--num-envs N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRESET = "cartpole-ppo"


def layout_flags(processes: int, num_envs: int, total_steps: int) -> list[str]:
    common = [
        "--env.num-envs",
        str(num_envs),
        "--total-steps",
        str(total_steps),
        "--log.console",
        "none",
        "--eval.every-updates",
        "0",
        "--layout.actor-device-ids",
        "0",
    ]
    if processes == 1:
        return common + [
            "--layout.cpu-devices",
            "2",
            "--layout.learner-device-ids",
            "0",
            "1",
            "--layout.actors-per-device",
            "2",
        ]
    return common + [
        "--layout.cpu-devices",
        "1",
        "--layout.learner-device-ids",
        "0",
        "--layout.actors-per-device",
        "1",
    ]


def child(args: argparse.Namespace, flags: list[str]) -> dict:
    from podrace.commands.train import parse_train
    from podrace.config import replace
    from podrace.runtime.xla_setup import force_cpu_devices

    cfg = parse_train([PRESET, *flags])
    cfg = replace(cfg, **{"log.run_dir": args.run_dir, "log.run_name": "run"})
    force_cpu_devices(cfg.layout.cpu_devices)
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from podrace.envs import env_spec
    from podrace.learner_mesh import LearnerPlacement, trajectory_shardings
    from podrace.runtime.build import dummy_trajectory
    from podrace.runtime.run import prepare

    if args.processes > 1:
        cfg = replace(
            cfg,
            **{
                "distributed.coordinator": f"127.0.0.1:{args.port}",
                "distributed.num_processes": args.processes,
                "distributed.process_id": args.process_id,
            },
        )
    run = prepare(cfg)
    learner = run.learner
    mesh = learner.keys.sharding.mesh
    params = learner.state.params
    param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    reduce = jax.jit(
        jax.shard_map(
            lambda t: jax.lax.psum(t, "learner"),
            mesh=mesh,
            in_specs=P(),
            out_specs=P(),
            check_vma=False,
        )
    )
    scalar = jax.device_put(np.zeros((), np.float32), NamedSharding(mesh, P()))

    def timed(tree) -> float:
        jax.block_until_ready(reduce(tree))
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            jax.block_until_ready(reduce(tree))
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    allreduce_s, scalar_s = timed(params), timed(scalar)
    # Static all-reduce ops of the compiled update (gradients and the global statistics of
    # each minibatch: valid count, advantage mean and std, loss terms).
    placement = LearnerPlacement(*trajectory_shardings(mesh))
    traj = placement.place(dummy_trajectory(cfg, env_spec(cfg.env), jax.local_devices()[0]))
    update = getattr(learner.update_fn, "__wrapped__", learner.update_fn).jitted
    hlo = update.lower(learner.state, (traj,) * cfg.num_actors, learner.keys).compile().as_text()
    hlo_ops = sum(
        1 for line in hlo.splitlines() if " all-reduce(" in line or " all-reduce-start(" in line
    )
    result = run.run()
    metrics_path = run.run_dir / "metrics.jsonl"
    steps = [json.loads(line).get("learner/step") for line in metrics_path.read_text().splitlines()]
    steps = [s for s in steps if s is not None]
    allreduces = cfg.ppo.num_epochs * cfg.ppo.num_minibatches
    step_s = statistics.mean(steps) if steps else float("nan")
    out = {
        "processes": args.processes,
        "learner_devices": [str(d) for d in mesh.devices.flat],
        "env_steps": result.env_steps,
        "updates": result.updates,
        "learn_s": result.learn_s,
        "compile_s": result.compile_s,
        "sps": result.env_steps / result.learn_s,
        "final_eval_return": result.final_eval.mean_return if result.final_eval else None,
        "learner_step_s": step_s,
        "param_bytes": param_bytes,
        "allreduces_per_update": allreduces,
        "bytes_allreduced_per_update": param_bytes * allreduces,
        "allreduce_s": allreduce_s,
        "allreduce_s_per_update": allreduce_s * allreduces,
        "allreduce_share_of_step": allreduce_s * allreduces / step_s if steps else None,
        "scalar_allreduce_s": scalar_s,
        "hlo_allreduce_ops": hlo_ops,
        "collective_s_per_update_estimate": allreduces
        * (allreduce_s + max(0, hlo_ops - 1) * scalar_s),
    }
    print(json.dumps(out), flush=True)
    run.cluster.leave(interrupted=lambda: None)  # with the others, once all are done
    sys.stdout.flush()
    os._exit(0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(processes: int, args: argparse.Namespace) -> dict:
    port = free_port()
    flags = layout_flags(processes, args.num_envs, args.total_steps)
    procs = []
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    run_dir = tempfile.mkdtemp(
        prefix="podrace-bench-mh-"
    )  # shared: process 1 writes run/process-1/
    try:
        for process in range(processes):
            command = [
                sys.executable,
                __file__,
                "--role",
                "child",
                "--processes",
                str(processes),
                "--process-id",
                str(process),
                "--port",
                str(port),
                "--run-dir",
                run_dir,
                "--repeats",
                str(args.repeats),
                "--",
                *flags,
            ]
            procs.append(
                subprocess.Popen(
                    command,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                    start_new_session=True,
                )
            )
        outs = []
        for proc in procs:
            out, err = proc.communicate(timeout=args.timeout_s)
            if proc.returncode != 0:
                raise SystemExit(f"benchmark child failed ({proc.returncode}):\n{err[-3000:]}")
            outs.append(json.loads(out.strip().splitlines()[-1]))
        return {"process_0": outs[0], **({"process_1": outs[1]} if len(outs) > 1 else {})}
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="benchmarks/results/multihost.json")
    parser.add_argument("--total-steps", type=int, default=100_000)
    parser.add_argument(
        "--num-envs", type=int, default=32, help="envs per actor thread (2 actor threads in all)"
    )
    parser.add_argument("--repeats", type=int, default=50, help="timed all-reduces per layout")
    parser.add_argument("--timeout-s", type=float, default=900)
    parser.add_argument("--role", default="main", help=argparse.SUPPRESS)
    parser.add_argument("--processes", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--process-id", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", default="", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.role == "child":
        child(args, [f for f in rest if f != "--"])
        return
    one = launch(1, args)
    print(f"1 process x 2 learner devices: {json.dumps(one)}", file=sys.stderr)
    two = launch(2, args)
    print(f"2 processes x 1 learner device: {json.dumps(two)}", file=sys.stderr)
    a, b = one["process_0"], two["process_0"]
    report = {
        "benchmark": "multihost",
        "preset": PRESET,
        "total_steps": args.total_steps,
        "envs_per_actor": args.num_envs,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "one_process_two_learner_devices": one,
        "two_processes_one_learner_device_each": two,
        "sps_ratio_two_processes_over_one": b["sps"] / a["sps"],
        "allreduce_s_ratio_two_processes_over_one": b["allreduce_s"] / a["allreduce_s"],
        "learner_step_s_ratio_two_processes_over_one": b["learner_step_s"] / a["learner_step_s"],
        # Same program, same data sizes: what the step gains across processes is (an upper
        # bound on) the time its collectives spend crossing processes, under training load.
        "cross_process_s_per_update_upper_bound": b["learner_step_s"] - a["learner_step_s"],
    }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
