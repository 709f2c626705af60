"""Checkpoint cost: what `Checkpointer.save` blocks its caller for, the background write,
and `restore`, for the RunState of the cartpole-ppo and atari-ppo presets; and the same
figures from real runs of every topology (threads, Ray workers, two processes).

blocked_s is the learner's cost (device_get of the state; the previous write is always
finished first here, so no waiting is included); write_s is the background thread's
orbax write plus the SHA-256 manifest; restore_s includes verifying the manifest.
Medians of `reps` saves of distinct versions (keep=2, so deletions are included).

Topologies: `podrace train cartpole-ppo` saving every 4 updates, then `--resume` of it;
write_s and blocked_s are the means its metric lines report over the run (every process
of a two-process run writes its part; process 0's figures), restore_s the resumed run's.

Usage: python benchmarks/checkpoint_bench.py [--out benchmarks/results/checkpoint.json]
       [--reps 5] [--topologies threads ray multihost]
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

import jax
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from podrace.checkpoints.files import Checkpointer  # noqa: E402
from podrace.checkpoints.read import restore  # noqa: E402
from podrace.checkpoints.state import RunState  # noqa: E402
from podrace.config import replace  # noqa: E402
from podrace.envs import env_spec  # noqa: E402
from podrace.learner_mesh import make_algorithm  # noqa: E402
from podrace.metrics.registry import Metrics  # noqa: E402
from podrace.networks import make_network  # noqa: E402
from podrace.presets import PRESETS  # noqa: E402


def initial_state(cfg, spec) -> RunState:
    network = make_network(cfg.network, spec)
    params = network.init(jax.random.PRNGKey(0), np.zeros((1,) + spec.obs_shape, spec.obs_dtype))
    n = cfg.num_actors
    return RunState(
        train_state=make_algorithm(cfg, network.apply).init(params),
        learner_keys=jax.random.split(jax.random.PRNGKey(1), n * cfg.env.num_envs),
        actor_keys=jax.random.split(jax.random.PRNGKey(2), n),
        actor_next_seq=(0,) * n,
        version=0,
        env_steps=0,
        episodes=0,
    )


def measure(preset: str, reps: int) -> dict:
    cfg = replace(PRESETS[preset][1], **{"checkpoint.keep": 2})
    spec = env_spec(cfg.env)
    state = initial_state(cfg, spec)
    nbytes = sum(np.asarray(x).nbytes for x in jax.tree.leaves(state.arrays()))
    with tempfile.TemporaryDirectory() as directory:
        metrics = Metrics()
        checkpointer = Checkpointer(Path(directory), cfg, spec, metrics)
        blocked, writes, restores = [], [], []
        for version in range(1, reps + 2):  # the first save is a warm-up
            checkpointer.wait()
            blocked.append(checkpointer.save(RunState(**{**state.__dict__, "version": version})))
            checkpointer.wait()
            writes.append(metrics.collect()["checkpoint/write_s"])
            start = time.perf_counter()
            restore(Path(directory), state, spec)
            restores.append(time.perf_counter() - start)
        checkpointer.close()
    return {
        "preset": preset,
        "state_mb": nbytes / 2**20,
        "blocked_s": statistics.median(blocked[1:]),
        "write_s": statistics.median(writes[1:]),
        "restore_s": statistics.median(restores[1:]),
        "write_mb_per_s": nbytes / 2**20 / statistics.median(writes[1:]),
    }


SPU = 2 * 8 * 16  # two actors (per process) x 8 envs x 16 steps


def _podrace(args: list[str], process: int | None = None, port: int = 0) -> list[str]:
    command = [sys.executable, "-m", "podrace.cli", "train", *args]
    if process is not None:
        command += [
            "--distributed.coordinator",
            f"127.0.0.1:{port}",
            "--distributed.num-processes",
            "2",
            "--distributed.process-id",
            str(process),
        ]
    return command


def _run(commands: list[list[str]]) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if len(commands) > 1:  # each process forces its own device count
        env["XLA_FLAGS"] = " ".join(
            f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f
        )
    procs = [
        subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for c in commands
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"{proc.args}: exit {proc.returncode}: {err.decode()[-2000:]}")


def _means(run_dir: Path, name: str) -> list[float]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [line[name] for line in lines if name in line]


def measure_topology(topology: str, updates: int) -> dict:
    """A fresh run saving every 4 updates, then a resume of it to twice its length."""
    with tempfile.TemporaryDirectory() as directory:
        flags = [
            "--rollout-length",
            "16",
            "--env.num-envs",
            "8",
            "--checkpoint.every-updates",
            "4",
            "--log.console",
            "none",
            "--log.interval-s",
            "0.5",
        ]
        if topology == "ray":
            flags += ["--runtime", "ray", "--ray.num-workers", "2"]
        steps = updates * SPU * (2 if topology == "multihost" else 1)
        fresh = [
            "cartpole-ppo",
            *flags,
            "--total-steps",
            str(steps),
            "--log.run-dir",
            directory,
            "--log.run-name",
            "r",
        ]
        resumed = ["--resume", f"{directory}/r", "--total-steps", str(2 * steps)]
        for args in (fresh, resumed):
            if topology == "multihost":
                port = _free_port()
                _run([_podrace(args, p, port) for p in (0, 1)])
            else:
                _run([_podrace(args)])
        run_dir = Path(directory) / "r"
        writes = _means(run_dir, "checkpoint/write_s")
        blocked = _means(run_dir, "checkpoint/blocked_s")
        restores = _means(run_dir, "checkpoint/restore_s")
        return {
            "topology": topology,
            "updates": 2 * updates,
            "checkpoints": len(list((run_dir / "checkpoints").iterdir())),
            "write_s": statistics.mean(writes),
            "blocked_s": statistics.mean(blocked),
            "restore_s": restores[-1],
        }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "checkpoint.json"
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--topologies", nargs="*", default=["threads", "ray", "multihost"], help="real runs"
    )
    parser.add_argument("--updates", type=int, default=40, help="of each run before its resume")
    args = parser.parse_args()
    results = {
        "machine": {
            "platform": platform.platform(),
            "jax": jax.__version__,
            "backend": jax.default_backend(),
        },
        "reps": args.reps,
        "presets": [measure(p, args.reps) for p in ("cartpole-ppo", "atari-ppo")],
        "topologies": [measure_topology(t, args.updates) for t in args.topologies],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: results[k] for k in ("presets", "topologies")}, indent=2))


if __name__ == "__main__":
    main()
