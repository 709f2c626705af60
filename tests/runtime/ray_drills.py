"""Drills on a running Ray cluster, run as a child process whose environment holds the
cluster's token (Ray reads it when imported): `python -m tests.runtime.ray_drills node-loss
ADDRESS TEMP_DIR ACTOR_NODE RUN_DIR OUT`. The result is JSON in OUT; the test asserts.

node-loss: an elastic run with `--ray.num-workers auto` on a head (1 CPU) and a node with
the `actor_node` resource (2 CPUs); after 20 updates the node's raylet is SIGKILLed (its
workers die with it, Ray reports them seconds later), then a third node (3 CPUs) is
started: the lost workers restart on it and `auto` adds a fourth worker there; 10 updates
later the drill stops the run.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from tests.runtime import ray_helpers
from tests.waiting import wait_until

DIES_IF_FLAGGED = "PODRACE_TEST_DIES_IF_FLAGGED"
"""A file path in the environment: once it exists, every Ray worker dies building its env."""


def dies_if_flagged(num_envs: int, seed: int):
    """An env factory: the worker dies building its env (as one whose node's resources are
    gone would never start) once the file named by DIES_IF_FLAGGED exists."""
    import ray

    from podrace.config import EnvConfig
    from podrace.envs import make_env

    in_worker = ray.get_runtime_context().get_actor_id() is not None
    if in_worker and os.path.exists(os.environ[DIES_IF_FLAGGED]):
        os._exit(1)
    return make_env(EnvConfig(), num_envs, seed)


AFTER_GROWTH = 10
"""Updates the grown cluster trains before the drill stops the run."""


def node_loss(address: str, temp_dir: str, actor_node: str, run_dir: str, out: str) -> None:
    from podrace.config import replace
    from podrace.presets import PRESETS
    from podrace.runtime.run import prepare

    cfg = replace(
        PRESETS["cartpole-ppo"][1],
        runtime="ray",
        # Far more than the drill trains: the drill, not the budget, ends the run.
        total_steps=40_000_000,
        rollout_length=32,
        seed=1,
        **{
            "env.num_envs": 8,
            "ppo.num_minibatches": 4,
            "ray.address": address,
            "ray.data_order": "elastic",
            "ray.num_workers": "auto",
            "ray.rollouts_per_update": 3,
            # Workers importing JAX on a loaded machine may take minutes to start: slower, not
            # a failed drill.
            "ray.start_timeout_s": 300,
            "eval.every_updates": 0,
            "eval.episodes": 8,
            "eval.num_envs": 8,
            "log.console": "none",
            "log.run_dir": run_dir,
            "log.interval_s": 0.25,
        },
    )
    run = prepare(cfg)
    batches: list[list[tuple[int, int, int]]] = []
    next_batch = run.pipeline.next_batch

    waits: list[tuple[int, float, float]] = []

    def recording(version):
        start = time.monotonic()
        rollouts, stats = next_batch(version)
        waits.append((version, start, time.monotonic()))
        batches.append([(r.actor_id, r.restart, r.seq) for r in rollouts])
        return rollouts, stats

    run.pipeline.next_batch = recording
    collector = run.fleet.collector
    failures: list[tuple[int, int, str]] = []
    failed = collector._failed

    def failing(slot, error):
        failures.append((run.learner.version, slot.worker_id, type(error).__name__))
        return failed(slot, error)

    collector._failed = failing
    report: dict = {}

    def drill() -> None:
        try:
            steps()
        except BaseException as error:  # a wait that timed out: the test names it
            report["drill_error"] = f"{type(error).__name__}: {error}"
        finally:
            run.lifetime.stop("drill done")

    def steps() -> None:
        # The elastic order learns once one worker is ready; the others join as they are.
        wait_until(lambda: collector.alive() == len(collector.slots) == 3, timeout=300)
        report["workers_at_start"] = len(collector.slots)
        report["workers_on_actor_node"] = sum(s.node == actor_node for s in collector.slots)
        wait_until(lambda: run.lifetime.stopping or run.learner.version >= 20, timeout=300)
        report["updates_killed"] = run.learner.version
        # The pipeline's pace at the kill: the silence after which it stops waiting for a
        # lost worker, and the usual seconds between one worker's rollouts.
        pipeline = run.pipeline
        with pipeline._cond:
            typical = pipeline._typical_interval()
            report["suspect_after_s"] = max(
                pipeline._suspect_after(s, typical) or 0.0 for s in pipeline._workers.values()
            )
            report["typical_interval_s"] = typical
        raylet = ray_helpers.raylet_pid(temp_dir, b"actor_node")
        report["killed_at"] = time.monotonic()
        os.kill(raylet, signal.SIGKILL)
        lost = report["workers_on_actor_node"]
        wait_until(lambda: run.lifetime.stopping or len(failures) >= lost, timeout=120)
        report["reported_at"] = time.monotonic()
        report["updates_reported"] = run.learner.version
        ray_helpers.start_node(address, temp_dir, '{"third_node": 1}', 3)
        report["updates_third_started"] = run.learner.version
        # Room for 4 workers now (1 on the head, 3 on the third node): the two lost ones
        # restart there and `auto` adds a fourth.
        wait_until(
            lambda: (
                run.lifetime.stopping
                or (len(collector.slots) >= 4 and collector.alive() == len(collector.slots))
            ),
            timeout=300,
        )
        report["updates_grown"] = grown = run.learner.version
        report["worker_nodes_after_join"] = {s.worker_id: s.node for s in collector.slots}
        # Learning goes on with the grown cluster; then the drill ends the run.
        wait_until(
            lambda: run.lifetime.stopping or run.learner.version >= grown + AFTER_GROWTH,
            timeout=300,
        )
        report["updates_stopped"] = run.learner.version
        # Read before the stop, which kills the relays: a metrics line that names a version
        # before the stop may still be written after it.
        relays = collector.relays
        report["relays_at_stop"] = len(relays.handles) if relays is not None else 0

    thread = threading.Thread(target=drill, daemon=True)
    thread.start()
    result = run.run()
    thread.join(30)
    lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    per_node: dict[str, float] = collections.Counter()
    for line in lines:
        for key, value in line.items():
            if key.startswith("ray/node/"):
                per_node[key.split("/")[2]] = value
    # The last line that names a version before the drill stopped the run.
    stopped = report.get("updates_stopped", result.updates + 1)
    last = [line for line in lines if line.get("version", 0) < stopped][-1]
    report.update(
        updates=result.updates,
        num_updates=cfg.num_updates,
        returns=[
            (line.get("version", 0), line["episode/return"])
            for line in lines
            if "episode/return" in line
        ],
        failures=failures,
        rollouts_per_node=per_node,
        waits=waits,
        dropped=result.ray.dropped_rollouts,
        lost_credits=result.ray.lost_credits,
        restarts=result.ray.restarts,
        relay_subscribers=[k for k in last if k.startswith("sync/subscriber/relay@")],
        relays_at_end=report.get("relays_at_stop", 0),
        weight_bytes_out_per_version=last.get("ray/weight_bytes_out_per_version"),
        learn_s=result.learn_s,
        batches=batches,
    )
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    drills = {"node-loss": node_loss}
    drills[sys.argv[1]](*sys.argv[2:])
