"""A resumed multi-host run continues every process's own counters; `podrace eval` of its
checkpoint plays the params in one process (two processes on this machine)."""

from __future__ import annotations

import json

import pytest

from tests.helpers.cli import podrace_command, run_flags, run_podrace
from tests.helpers.runs import metric_lines
from tests.runtime.multihost_processes import (
    ROOT,
    SMALL_FLAGS,
    SMALL_SPU,
    env,
    finish,
    free_port,
    processes,
)


def command(process: int, port: int, *args: str) -> list[str]:
    return podrace_command(
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
    )


def both_ok(results) -> None:
    assert [code for code, _, _ in results] == [0, 0], "\n".join(e[-3000:] for _, _, e in results)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_each_process_continues_its_own_counters_and_eval_plays_the_checkpoint(tmp_path):
    run_dir = tmp_path / "r"
    parts = [run_dir, run_dir / "process-1"]
    fresh = ("cartpole-ppo", *SMALL_FLAGS, "--log.console", "none", *run_flags(tmp_path))
    port = free_port()
    with processes(
        [command(p, port, *fresh, "--total-steps", str(6 * SMALL_SPU)) for p in range(2)]
    ) as procs:
        both_ok(finish(procs, 240))
    before = [metric_lines(part) for part in parts]
    episodes = [lines[-1]["episodes"] for lines in before]
    meta = json.loads((run_dir / "checkpoints" / "6" / "meta" / "metadata").read_text())
    assert [c["episodes"] for c in meta["counters"]] == episodes  # each process's own

    port = free_port()
    resumed = (
        "--resume",
        str(run_dir),
        "--log.console",
        "none",
        "--total-steps",
        str(12 * SMALL_SPU),
    )
    with processes([command(p, port, *resumed) for p in range(2)]) as procs:
        both_ok(finish(procs, 240))
    for process, part in enumerate(parts):
        after = metric_lines(part)[len(before[process]) :]
        assert after and after[-1]["version"] == 12, process
        assert after[0]["checkpoint/version"] >= 6, (process, after[0])
        seen = [line["episodes"] for line in after]
        assert seen == sorted(seen) and seen[0] >= episodes[process], (process, episodes, seen)

    done = run_podrace("eval", str(run_dir), "--episodes", "2", cwd=ROOT, env=env(), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((run_dir / "eval-12.json").read_text())["checkpoint"] == 12
