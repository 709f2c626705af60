"""Ray runtime benchmarks; every run in a fresh child process, one after the other, and the
figures a suite compares side by side in one JSON file.

--suite threads (results/ray_runtime.json): `cartpole-ppo` with 2 actor threads against 2
  Ray workers (ENVS envs each), T = 8 and T = 32, and 1 or 2 Ray workers whose learner's
  update is a no-op (what the workers and the Ray sink deliver alone). Steps/s count env
  steps consumed by the learner over the seconds from starting the loops to the last update
  (compile and Ray start-up excluded, reported apart).

--suite kills (results/ray_elastic_kills.json): fixed against elastic data order, 2 Ray
  workers on a private local Ray, without kills and with a worker SIGKILLed every
  --kill-every seconds (the workers in turn, each kill once the last replacement is up, so
  every kill hits a full set of workers). Per run:
  env steps/s over the learning time, restarts, the learner's longest wait for a batch
  (`ray/data_wait_max_s` at its largest) and the longest gap between two updates.

--suite relay (results/ray_relay_bytes.json): the bytes that leave the learner's node per
  weight version, 8 workers on 2 local Ray nodes (4 on the learner's node, 4 on the other),
  with and without the per-node relay (`--ray.no-node-relay`). Measured on the wire: the
  TCP bytes received by the second node's processes on connections from the learner node's
  processes (`ss -tinp` counters, sampled after 20 updates and at the end), divided by the
  versions published in between; beside it the run's own `ray/weight_bytes_out_per_version`
  (param bytes x nodes that fetched each version) and the param bytes of one version.

    python benchmarks/ray_runtime.py --suite kills [--steps N] [--kill-every S] [flags...]

Extra arguments are passed to every run as `podrace train` flags.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PRESET = "cartpole-ppo"
ENVS = 32
RAY = str(Path(sys.executable).with_name("ray"))


def _train_args(steps: int, envs: int, rollout: int, overrides: list[str]) -> list[str]:
    return [
        PRESET,
        "--total-steps",
        str(steps),
        "--env.num-envs",
        str(envs),
        "--rollout-length",
        str(rollout),
        "--log.console",
        "none",
        "--log.run-dir",
        tempfile.mkdtemp(prefix="podrace-bench-"),
        "--log.interval-s",
        "0.25",
        "--eval.episodes",
        "8",
        *overrides,
    ]


def _prepare(args: list[str]):
    from podrace.commands.train import parse_train
    from podrace.runtime.run import prepare
    from podrace.runtime.xla_setup import force_cpu_devices

    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    cfg = parse_train(args)
    force_cpu_devices(cfg.layout.cpu_devices)
    return prepare(cfg)


def _lines(result) -> list[dict]:
    return [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]


# --suite threads ---------------------------------------------------------------------------
def threads_child(mode: str, steps: int, overrides: list[str]) -> dict:
    kind, _, n = mode.rpartition("-")
    flags = ["--rollout-length", n if kind != "ray-actors" else "8"]
    if kind == "threads":
        flags += ["--layout.actors-per-device", "2"]
    else:
        workers = 2 if kind == "ray" else int(n)
        flags += ["--runtime", "ray", "--ray.num-workers", str(workers)]
    start = time.perf_counter()
    run = _prepare(_train_args(steps, ENVS, 8, flags + overrides))
    if mode.startswith("ray-actors"):
        run.learner.update_fn = lambda state, trajs, keys: (state, keys, {"finite": True})
    result = run.run()
    out = {
        "mode": mode,
        "wall_s": time.perf_counter() - start,
        "compile_s": result.compile_s,
        "learn_s": result.learn_s,
        "env_steps": result.env_steps,
        "updates": result.updates,
        "sps": result.env_steps / result.learn_s,
        "final_eval_return": result.final_eval.mean_return if result.final_eval else None,
        "max_policy_lag": result.max_policy_lag,
    }
    if kind != "threads":
        lines = _lines(result)
        out.update(
            object_store_bytes_end=result.ray.object_store_bytes,
            object_store_bytes_max=max(line.get("ray/object_store_bytes", -1) for line in lines),
            restarts=result.ray.restarts,
        )
    return out


def threads_report(runs: dict, args) -> dict:
    ratio = {t: runs[f"ray-{t}"]["sps"] / runs[f"threads-{t}"]["sps"] for t in ("8", "32")}
    return {
        "ray_over_threads": {f"T={t}": r for t, r in ratio.items()},
        "actor_only_sps": {"1": runs["ray-actors-1"]["sps"], "2": runs["ray-actors-2"]["sps"]},
        "actor_only_scaling_2_over_1": runs["ray-actors-2"]["sps"] / runs["ray-actors-1"]["sps"],
        "object_store_bytes_end": runs["ray-8"]["object_store_bytes_end"],
        "object_store_bytes_max_during_run": runs["ray-8"]["object_store_bytes_max"],
    }


# --suite kills -----------------------------------------------------------------------------
def kills_child(mode: str, steps: int, overrides: list[str], kill_every: float) -> dict:
    order, _, kills = mode.partition("-")
    flags = ["--runtime", "ray", "--ray.num-workers", "2", "--ray.data-order", order]
    flags += ["--ray.max-restarts", "1000"]
    run = _prepare(_train_args(steps, 16, 32, flags + overrides))
    updated: list[float] = []
    after = run.learner.on_update

    def timed(version: int) -> None:
        updated.append(time.perf_counter())
        after(version)

    run.learner.on_update = timed
    killed: list[tuple[float, int]] = []

    def killer() -> None:
        slots, turn = run.fleet.slots, 0
        while not run.lifetime.wait(kill_every):
            # Each kill hits a full set of workers (the last replacement is up), in turn.
            while not all(s.ready and s.pid > 0 for s in slots) and not run.lifetime.stopping:
                run.lifetime.wait(0.05)
            slot = slots[turn % len(slots)]
            if run.lifetime.stopping or slot.pid <= 0:
                return
            with contextlib.suppress(ProcessLookupError):
                os.kill(slot.pid, signal.SIGKILL)
                killed.append((time.perf_counter(), run.learner.version))
            turn += 1

    if kills == "kills":
        threading.Thread(target=killer, daemon=True).start()
    start = time.perf_counter()
    result = run.run()
    lines = _lines(result)
    gaps = [b - a for a, b in zip(updated, updated[1:])]
    return {
        "mode": mode,
        "learn_s": result.learn_s,
        "env_steps": result.env_steps,
        "updates": result.updates,
        "sps": result.env_steps / result.learn_s,
        "kills": len(killed),
        "restarts": result.ray.restarts,
        "longest_gap_between_updates_s": max(gaps) if gaps else None,
        "updates_slower_than_1s": sum(g > 1.0 for g in gaps),
        "data_wait_max_s": max(line.get("ray/data_wait_max_s", 0.0) for line in lines),
        "dropped_rollouts": result.ray.dropped_rollouts,
        "lost_rollouts": result.ray.lost_rollouts,
        "max_policy_lag": result.max_policy_lag,
        "final_eval_return": result.final_eval.mean_return if result.final_eval else None,
        "wall_s": time.perf_counter() - start,
    }


def kills_report(runs: dict, args) -> dict:
    return {
        "kill_every_s": args.kill_every,
        "sps": {mode: runs[mode]["sps"] for mode in runs},
        "elastic_over_fixed": {
            "no kills": runs["elastic-none"]["sps"] / runs["fixed-none"]["sps"],
            "with kills": runs["elastic-kills"]["sps"] / runs["fixed-kills"]["sps"],
        },
        "with_kills_over_without": {
            order: runs[f"{order}-kills"]["sps"] / runs[f"{order}-none"]["sps"]
            for order in ("fixed", "elastic")
        },
        "longest_gap_between_updates_s": {
            mode: runs[mode]["longest_gap_between_updates_s"] for mode in runs
        },
        "data_wait_max_s": {mode: runs[mode]["data_wait_max_s"] for mode in runs},
    }


# --suite relay ------------------------------------------------------------------------------
def tcp_sockets() -> dict[tuple[str, str], tuple[int | None, int]]:
    """(local, peer) -> (owning pid, bytes received) of every TCP socket `ss` shows."""
    out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, check=True).stdout
    sockets: dict[tuple[str, str], tuple[int | None, int]] = {}
    key = None
    for line in out.splitlines():
        if not line[:1].isspace():
            fields = line.split()
            pid = re.search(r"pid=(\d+)", line)
            key = (fields[3], fields[4])
            sockets[key] = (int(pid.group(1)) if pid else None, 0)
        elif key is not None:
            got = re.search(r"bytes_received:(\d+)", line)
            if got:
                sockets[key] = (sockets[key][0], int(got.group(1)))
    return sockets


def node_processes(temp_dir: str, marker: bytes) -> set[int]:
    """The raylet started with `marker` among its arguments, and all its descendants."""
    from podrace.runtime.ray.processes import _stat, process_tree

    tree = process_tree(temp_dir)
    parent = {pid: st[0] for pid in tree if (st := _stat(pid)) is not None}
    roots = set()
    for pid in tree:
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if argv[0].endswith(b"raylet") and any(marker in a for a in argv):
                roots.add(pid)
    members, grew = set(roots), True
    while grew:
        more = {pid for pid, ppid in parent.items() if ppid in members} - members
        members |= more
        grew = bool(more)
    return members


def bytes_into(members: set[int], before: dict, after: dict) -> int:
    """TCP bytes `members` received from processes outside them between two snapshots."""
    owner = {local: pid for (local, _), (pid, _) in after.items()}
    total = 0
    for (local, peer), (pid, received) in after.items():
        if pid in members and owner.get(peer) not in members and owner.get(peer) is not None:
            total += received - before.get((local, peer), (pid, 0))[1]
    return total


def relay_child(mode: str, steps: int, overrides: list[str], temp_dir: str, address: str) -> dict:
    flags = ["--runtime", "ray", "--ray.address", address, "--ray.num-workers", "8"]
    if mode == "direct":
        flags.append("--ray.no-node-relay")
    run = _prepare(_train_args(steps, 4, 16, flags + overrides))
    members = node_processes(temp_dir, b"actor_node")
    samples: list[tuple[int, dict, set[int]]] = []

    def sampler() -> None:
        for at in (20, run.cfg.num_updates - 5):
            while run.learner.version < at and not run.lifetime.stopping:
                time.sleep(0.01)
            if run.lifetime.stopping:
                return
            now = node_processes(temp_dir, b"actor_node")
            samples.append((run.learner.version, tcp_sockets(), now))

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    result = run.run()
    thread.join(5)
    (v0, first, _), (v1, last, later) = samples
    received = bytes_into(members | later, first, last)
    lines = _lines(result)
    nodes = {s.node for s in run.fleet.slots}
    return {
        "mode": mode,
        "versions_measured": v1 - v0,
        "wire_bytes_into_second_node_per_version": received / (v1 - v0),
        "metric_weight_bytes_out_per_version": lines[-2].get("ray/weight_bytes_out_per_version"),
        "param_bytes_per_version": run.fleet._params_bytes,
        "workers_per_node": sorted(sum(s.node == n for s in run.fleet.slots) for n in nodes),
        "relays": lines[-2].get("ray/relays", 0),
        "learner_board_subscribers": sorted(k for k in lines[-2] if k.startswith("sync/sub")),
        "sps": result.env_steps / result.learn_s,
    }


@contextlib.contextmanager
def two_nodes(env: dict):
    """A head (4 CPUs) and a second node (4 CPUs, resource actor_node) on 127.0.0.1, token
    auth, in a private temp dir; stopped by their processes' ids afterwards."""
    from podrace.runtime.ray.processes import stop_ray

    temp_dir = tempfile.mkdtemp(prefix="prb-", dir="/tmp")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    common = ["--temp-dir", temp_dir, "--disable-usage-stats", "--num-cpus", "4"]
    try:
        subprocess.run(
            [RAY, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port)]
            + ["--include-dashboard", "false", *common],
            env=env,
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [RAY, "start", "--address", f"127.0.0.1:{port}", "--resources", '{"actor_node": 4}']
            + common,
            env=env,
            check=True,
            capture_output=True,
        )
        yield temp_dir, f"127.0.0.1:{port}"
    finally:
        stop_ray(temp_dir, grace_s=2)
        subprocess.run(["rm", "-rf", temp_dir], check=False)


def relay_report(runs: dict, args) -> dict:
    wire = {m: runs[m]["wire_bytes_into_second_node_per_version"] for m in runs}
    return {
        "wire_bytes_out_of_learner_node_per_version": wire,
        "direct_over_relay": wire["direct"] / wire["relay"],
        "metric_weight_bytes_out_per_version": {
            m: runs[m]["metric_weight_bytes_out_per_version"] for m in runs
        },
        "param_bytes_per_version": runs["relay"]["param_bytes_per_version"],
    }


SUITES = {
    "threads": (
        ("threads-8", "ray-8", "threads-32", "ray-32", "ray-actors-1", "ray-actors-2"),
        threads_report,
        "benchmarks/results/ray_runtime.json",
    ),
    "kills": (
        ("fixed-none", "elastic-none", "fixed-kills", "elastic-kills"),
        kills_report,
        "benchmarks/results/ray_elastic_kills.json",
    ),
    "relay": (("relay", "direct"), relay_report, "benchmarks/results/ray_relay_bytes.json"),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--suite", choices=sorted(SUITES), default="threads")
    parser.add_argument("--out", help="default: the suite's file in benchmarks/results")
    parser.add_argument("--steps", type=int, help="env steps per run (default per suite)")
    parser.add_argument("--kill-every", type=float, default=10.0, help="kills: seconds")
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--cluster", nargs=2, help=argparse.SUPPRESS)
    args, overrides = parser.parse_known_args()
    steps = args.steps or {"threads": 200_000, "kills": 1_000_000, "relay": 40_000}[args.suite]
    if args.mode:
        if args.suite == "threads":
            out = threads_child(args.mode, steps, overrides)
        elif args.suite == "kills":
            out = kills_child(args.mode, steps, overrides, args.kill_every)
        else:
            out = relay_child(args.mode, steps, overrides, *args.cluster)
        print(json.dumps(out))
        return
    modes, report_fn, default_out = SUITES[args.suite]
    env = dict(os.environ)
    env.setdefault("RAY_AUTH_MODE", "token")
    env.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(16))
    runs = {}
    with two_nodes(env) if args.suite == "relay" else contextlib.nullcontext() as cluster:
        order = list(modes)
        if args.suite == "relay":
            random.shuffle(order)  # neither mode always runs on a fresher cluster
        for mode in order:
            command = [sys.executable, __file__, "--suite", args.suite, "--mode", mode]
            command += ["--steps", str(steps), "--kill-every", str(args.kill_every)]
            if cluster is not None:
                command += ["--cluster", *cluster]
            done = subprocess.run(command + overrides, capture_output=True, text=True, env=env)
            if done.returncode:
                sys.exit(f"{mode} failed:\n{done.stderr[-4000:]}")
            runs[mode] = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{mode}: {json.dumps(runs[mode])}", file=sys.stderr)
    report = {
        "benchmark": f"ray_runtime --suite {args.suite}",
        "preset": PRESET,
        "steps": steps,
        "overrides": overrides,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "runs": runs,
        **report_fn(runs, args),
        "load_average_at_end": os.getloadavg(),
    }
    path = Path(args.out or default_out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
