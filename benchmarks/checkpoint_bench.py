"""Checkpoint cost: what `Checkpointer.save` blocks its caller for, the background write,
and `restore`, for the RunState of the cartpole-ppo and atari-ppo presets.

blocked_s is the learner's cost (device_get of the state; the previous write is always
finished first here, so no waiting is included); write_s is the background thread's
orbax write plus the SHA-256 manifest; restore_s includes verifying the manifest.
Medians of `reps` saves of distinct versions (keep=2, so deletions are included).

Usage: python benchmarks/checkpoint_bench.py [--out benchmarks/results/checkpoint.json] [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from podrace.checkpoint import Checkpointer, RunState  # noqa: E402
from podrace.config import replace  # noqa: E402
from podrace.envs import env_spec  # noqa: E402
from podrace.learner_mesh import make_algorithm  # noqa: E402
from podrace.metrics.registry import Metrics  # noqa: E402
from podrace.networks import make_network  # noqa: E402
from podrace.presets import PRESETS  # noqa: E402
from podrace.restore import restore  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "checkpoint.json"
    )
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    results = {
        "machine": {
            "platform": platform.platform(),
            "jax": jax.__version__,
            "backend": jax.default_backend(),
        },
        "reps": args.reps,
        "presets": [measure(p, args.reps) for p in ("cartpole-ppo", "atari-ppo")],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results["presets"], indent=2))


if __name__ == "__main__":
    main()
