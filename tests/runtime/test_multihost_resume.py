"""A resumed multi-host run continues every process's own counters; `podrace eval` of its
checkpoint plays the params in one process (two processes on this machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.multihost_processes import ROOT, env, finish, free_port, processes

SPU = 2 * 1 * 8 * 16  # processes x actors x envs x rollout length
FLAGS = (
    "--layout.actors-per-device",
    "1",
    "--env.num-envs",
    "8",
    "--rollout-length",
    "16",
    "--network.hidden-sizes",
    "16",
    "--ppo.num-minibatches",
    "2",
    "--eval.episodes",
    "2",
    "--eval.num-envs",
    "2",
    "--log.interval-s",
    "0.2",
    "--log.console",
    "none",
)


def command(process: int, port: int, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "podrace.cli",
        "train",
        *args,
        "--distributed.coordinator",
        f"127.0.0.1:{port}",
        "--distributed.num-processes",
        "2",
        "--distributed.process-id",
        str(process),
        "--distributed.init-timeout-s",
        "60",
    ]


def lines_of(part: Path) -> list[dict]:
    return [json.loads(x) for x in (part / "metrics.jsonl").read_text().splitlines()]


def both_ok(results) -> None:
    assert [code for code, _, _ in results] == [0, 0], "\n".join(e[-3000:] for _, _, e in results)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_each_process_continues_its_own_counters_and_eval_plays_the_checkpoint(tmp_path):
    run_dir = tmp_path / "r"
    parts = [run_dir, run_dir / "process-1"]
    fresh = ("cartpole-ppo", *FLAGS, "--log.run-dir", str(tmp_path), "--log.run-name", "r")
    port = free_port()
    with processes(
        [command(p, port, *fresh, "--total-steps", str(6 * SPU)) for p in range(2)]
    ) as procs:
        both_ok(finish(procs, 240))
    before = [lines_of(part) for part in parts]
    episodes = [lines[-1]["episodes"] for lines in before]
    meta = json.loads((run_dir / "checkpoints" / "6" / "meta" / "metadata").read_text())
    assert [c["episodes"] for c in meta["counters"]] == episodes  # each process's own

    port = free_port()
    resumed = ("--resume", str(run_dir), "--log.console", "none", "--total-steps", str(12 * SPU))
    with processes([command(p, port, *resumed) for p in range(2)]) as procs:
        both_ok(finish(procs, 240))
    for process, part in enumerate(parts):
        after = lines_of(part)[len(before[process]) :]
        assert after and after[-1]["version"] == 12, process
        assert after[0]["checkpoint/version"] >= 6, (process, after[0])
        seen = [line["episodes"] for line in after]
        assert seen == sorted(seen) and seen[0] >= episodes[process], (process, episodes, seen)

    done = subprocess.run(
        [sys.executable, "-m", "podrace.cli", "eval", str(run_dir), "--episodes", "2"],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((run_dir / "eval-12.json").read_text())["checkpoint"] == 12
