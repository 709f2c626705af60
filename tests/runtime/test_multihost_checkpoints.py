"""Checkpoints and resume of a multi-process run (two processes on this machine).

Every process writes its part of each checkpoint (orbax's multi-process save) into the one
run directory they share; every process of a resumed run restores its own shards.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.cli import podrace_command, run_flags
from tests.runtime.multihost_processes import (
    SMALL_FLAGS,
    SMALL_SPU,
    both_processes,
    finish,
    free_port,
    last_line_starting,
    processes,
    wait_for_metrics,
)
from tests.waiting import wait_until


def train_both(port: int, *flags: str) -> list[list[str]]:
    return both_processes(port, *SMALL_FLAGS, *flags)


def resume_both(port: int, run_dir: Path, *flags: str) -> list[list[str]]:
    return [
        podrace_command(
            "train",
            "--resume",
            str(run_dir),
            "--distributed.coordinator",
            f"127.0.0.1:{port}",
            "--distributed.num-processes",
            "2",
            "--distributed.process-id",
            str(p),
            *flags,
        )
        for p in range(2)
    ]


def checkpoints(run_dir: Path) -> list[int]:
    folder = run_dir / "checkpoints"
    return (
        sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.exists() else []
    )


def saved_arrays(step_dir: Path) -> dict[str, np.ndarray]:
    """Every array of a checkpoint step, read back in this process (as NumPy arrays)."""
    import jax
    import orbax.checkpoint as ocp

    reader = ocp.Checkpointer(
        ocp.CompositeCheckpointHandler(arrays=ocp.StandardCheckpointHandler())
    )
    saved = reader.metadata(step_dir).item_metadata["arrays"]
    template = jax.tree.map(
        lambda m: np.zeros(m.shape, m.dtype),
        getattr(saved, "tree", saved),
        is_leaf=lambda m: hasattr(m, "shape"),
    )
    arrays = reader.restore(
        step_dir, args=ocp.args.Composite(arrays=ocp.args.StandardRestore(template))
    )
    flat = jax.tree_util.tree_flatten_with_path(arrays["arrays"])[0]
    return {jax.tree_util.keystr(path): np.asarray(x) for path, x in flat}


def meta(step_dir: Path) -> dict:
    return json.loads((step_dir / "meta" / "metadata").read_text())


def done_lines(results) -> list[str]:
    return [
        next(line for line in out.splitlines() if line.startswith("done:")) for _, out, _ in results
    ]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigterm_to_both_saves_the_state_a_straight_run_has_and_both_resume_to_the_end(tmp_path):
    """Deterministic mode: the state saved when both processes are stopped at update v is
    bit for bit the state a straight run of v updates saves (a constant learning rate: an
    annealed one depends on the run's length); resuming both processes then trains to the
    full step count, from the checkpoint's version on."""
    total = 200 * SMALL_SPU
    flags = (
        "--deterministic",
        "--ppo.no-anneal-lr",
        "--log.run-dir",
        str(tmp_path),
        "--total-steps",
        str(total),
    )
    with processes(train_both(free_port(), *flags, "--log.run-name", "stopped")) as procs:
        wait_for_metrics(tmp_path / "stopped" / "metrics.jsonl", procs, lines=4)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        results = finish(procs, 120)
    for code, _, err in results:
        assert code == 128 + signal.SIGTERM, err[-3000:]
    saved = checkpoints(tmp_path / "stopped")
    assert len(saved) == 1, results[0][2][-3000:] + results[1][2][-3000:]
    (version,) = saved
    assert 0 < version < 200
    for _, _, err in results:
        assert f"checkpoint {version} saved (podrace train --resume {tmp_path / 'stopped'})" in err

    with processes(
        train_both(
            free_port(),
            *flags[:4],
            "--total-steps",
            str(version * SMALL_SPU),
            "--log.run-name",
            "straight",
        )
    ) as procs:
        results = finish(procs, 240)
    assert [code for code, _, _ in results] == [0, 0], results[0][2][-3000:] + results[1][2][-3000:]
    assert checkpoints(tmp_path / "straight")[-1] == version
    stopped = tmp_path / "stopped" / "checkpoints" / str(version)
    straight = tmp_path / "straight" / "checkpoints" / str(version)
    a, b = saved_arrays(stopped), saved_arrays(straight)
    assert a.keys() == b.keys()
    assert [k for k in a if not np.array_equal(a[k], b[k])] == []
    assert len({tuple(k) for k in a["['actor_keys']"]}) == 2  # one per actor of either process
    for field in ("version", "env_steps", "actor_next_seq", "skipped_updates"):
        assert meta(stopped)[field] == meta(straight)[field], field

    # The resume trains 16 more updates (a resume may lower --total-steps to any count past
    # its checkpoint; the learning rate is constant here).
    end = version + 16
    with processes(
        resume_both(
            free_port(),
            tmp_path / "stopped",
            "--log.console",
            "none",
            "--total-steps",
            str(end * SMALL_SPU),
        )
    ) as procs:
        results = finish(procs, 300)
    assert [code for code, _, _ in results] == [0, 0], results[0][2][-3000:] + results[1][2][-3000:]
    for line in done_lines(results):
        assert line.startswith(f"done: {end * SMALL_SPU:,} env steps, {end} updates"), line
    lines = [
        json.loads(x) for x in (tmp_path / "stopped" / "metrics.jsonl").read_text().splitlines()
    ]
    assert lines[-1]["version"] == end and lines[-1]["env_steps"] == end * SMALL_SPU
    versions = [x["version"] for x in lines]
    assert versions == sorted(versions)
    assert checkpoints(tmp_path / "stopped")[-1] == end


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigkill_of_process_1_then_a_resume_of_both_continues_from_the_last_periodic_checkpoint(
    tmp_path,
):
    flags = (
        *run_flags(tmp_path),
        "--total-steps",
        str(10**6 * SMALL_SPU),  # never reached: process 1 is killed long before
        "--checkpoint.every-updates",
        "4",
    )
    run_dir = tmp_path / "r"
    with processes(train_both(free_port(), *flags)) as procs:
        wait_until(
            lambda: len(checkpoints(run_dir)) >= 2,
            240,
            lambda: "no periodic checkpoint",
            while_alive=procs,
        )
        os.killpg(procs[1].pid, signal.SIGKILL)
        killed = time.monotonic()
        code0, _, err0 = finish(procs[:1], 90)[0]
        elapsed = time.monotonic() - killed
    # Process 0 fails naming process 1, without waiting for JAX's heartbeat timeout (100 s).
    assert code0 == 1 and elapsed < 60, (elapsed, err0[-3000:])
    last_error = last_line_starting(err0, "podrace: error:")
    assert "process-1 failed: PeerLost: process 1 closed its connection" in last_error, err0[-3000:]
    last = checkpoints(run_dir)[-1]
    assert last % 4 == 0 and last >= 8

    shutil.copytree(run_dir, tmp_path / "copy")
    end = last + 16  # the resume trains 16 more updates
    total = end * SMALL_SPU
    resume = resume_both(free_port(), run_dir, "--log.console", "none", "--total-steps", str(total))
    with processes(resume) as procs:
        results = finish(procs, 400)
    assert [code for code, _, _ in results] == [0, 0], results[0][2][-3000:] + results[1][2][-3000:]
    for line in done_lines(results):
        assert line.startswith(f"done: {total:,} env steps, {end} updates"), line
    saved = checkpoints(run_dir)
    assert saved[-1] == end and all(s >= last for s in saved)
    assert not [p for p in (run_dir / "checkpoints").iterdir() if not p.name.isdigit()]
    assert meta(run_dir / "checkpoints" / str(end))["env_steps"] == total


LAUNCHER = """
import json, os, sys
from pathlib import Path

import podrace
from podrace.config import replace
from podrace.envs import make_env
from podrace.presets import PRESETS
from podrace.runtime.threads import actors

out, process, port = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
seeds, keys = [], []

def recording_factory(num_envs, seed):
    seeds.append(seed)
    return make_env(cfg.env, num_envs, seed)

build_actor = actors.build_actor

def recording_build_actor(*args, **kwargs):
    actor = build_actor(*args, **kwargs)
    keys.append([int(x) for x in actor.settings.key])
    return actor

actors.build_actor = recording_build_actor
cfg = replace(
    PRESETS["cartpole-ppo"][1],
    total_steps=2 * 2 * 8 * 16 * 4,
    rollout_length=16,
    **{
        "env.num_envs": 8,
        "layout.actors_per_device": 2,
        "network.hidden_sizes": (16,),
        "eval.episodes": 2,
        "eval.num_envs": 2,
        "log.console": "none",
        "log.run_dir": str(out),
        "log.run_name": "r",
        "distributed.coordinator": f"127.0.0.1:{port}",
        "distributed.num_processes": 2,
        "distributed.process_id": process,
    },
)
result = podrace.train(cfg, env_factory=recording_factory)
print(json.dumps({
    "updates": result.updates, "env_steps": result.env_steps, "topology": result.topology,
    "final_eval": None if result.final_eval is None else result.final_eval.mean_return,
    "seeds": seeds, "keys": keys,
}), flush=True)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_podrace_train_runs_two_processes_whose_actors_all_have_their_own_seeds_and_keys(
    tmp_path,
):
    """`podrace.train` in each process of a launcher: a result in each, and every (process,
    actor) pair acts with its own env seeds and sampling key."""
    port = free_port()
    script = tmp_path / "launch.py"
    script.write_text(LAUNCHER)
    commands = [[sys.executable, str(script), str(tmp_path), str(p), str(port)] for p in range(2)]
    with processes(commands) as procs:
        results = finish(procs, 240)
    assert [code for code, _, _ in results] == [0, 0], results[0][2][-3000:] + results[1][2][-3000:]
    reports = [json.loads(out.strip().splitlines()[-1]) for _, out, _ in results]
    for process, report in enumerate(reports):
        assert report["updates"] == 4 and report["env_steps"] == 4 * 2 * 2 * 8 * 16, report
        assert report["topology"] == "multihost"
        assert (report["final_eval"] is None) == (process == 1)
        assert len(report["keys"]) == 2
    # The factory's first call is the spec probe (seed 0); then each actor's envs, then the
    # evaluator's on process 0.
    actor_seeds = [s for r in reports for s in r["seeds"][1:3]]
    keys = [tuple(k) for r in reports for k in r["keys"]]
    assert len(set(actor_seeds)) == 4, reports
    assert len(set(keys)) == 4, reports
