"""`benchmarks/learning.py`: the grid runner end to end on its smoke suite (CartPole, 100k
steps): a run directory left without a checkpoint is set aside, the run is stopped by a
signal after its first checkpoint, resumed, then skipped as done."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.waiting import wait_for_exit, wait_until

REPO = Path(__file__).resolve().parents[1]
RUN = "cartpole-ppo__CartPole-v1__s1"
SPU = 64 * 8  # cartpole-ppo: env steps per update


def runner(tmp_path: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        str(REPO / "benchmarks" / "learning.py"),
        "--suite",
        "smoke",
        "--seeds",
        "1",
        "--runs",
        str(tmp_path / "runs"),
        "--results",
        str(tmp_path / "results"),
        *args,
    ]


def env() -> dict:
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def checkpoints(run_dir: Path) -> list[str]:
    folder = run_dir / "checkpoints"
    return [p.name for p in folder.iterdir() if p.name.isdigit()] if folder.is_dir() else []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_stopped_run_resumes_from_its_checkpoint_and_a_finished_one_is_skipped(tmp_path):
    run_dir = tmp_path / "runs" / "smoke" / RUN
    result = tmp_path / "results" / "smoke" / f"{RUN}.json"
    log = tmp_path / "runs" / "smoke" / f"{RUN}.log"
    segments = run_dir.parent / f"{RUN}.segments.json"
    run_dir.mkdir(parents=True)  # a launch killed before its first checkpoint
    (run_dir / "config.json").write_text("{}")
    segments.write_text(json.dumps([{"wall_s": 1000.0, "from_update": 0, "exit_code": -9}]))

    first = subprocess.Popen(
        runner(tmp_path), env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    wait_until(lambda: checkpoints(run_dir), 300, log.read_text, while_alive=first)
    first.send_signal(signal.SIGTERM)
    assert wait_for_exit(first, 120) == 128 + signal.SIGTERM, first.communicate()[0]
    assert "podrace: SIGINT received, stopped cleanly; checkpoint" in log.read_text()
    assert not result.exists()
    [stopped] = json.loads(segments.read_text())
    assert stopped["exit_code"] == 128 + signal.SIGINT
    [aside] = [p.name for p in run_dir.parent.iterdir() if ".abandoned-" in p.name and p.is_dir()]
    assert (run_dir.parent / aside / "config.json").read_text() == "{}"
    assert json.loads((run_dir.parent / f"{aside}.segments.json").read_text())[0]["wall_s"] == 1000

    second = subprocess.run(
        runner(tmp_path), env=env(), capture_output=True, text=True, timeout=500
    )
    assert second.returncode == 0, second.stdout + second.stderr + log.read_text()
    resumed_from = int(re.search(r"resume from update (\d+)", second.stdout).group(1))
    assert resumed_from > 0
    data = json.loads(result.read_text())
    assert (data["suite"], data["preset"], data["task"], data["seed"]) == (
        "smoke",
        "cartpole-ppo",
        "CartPole-v1",
        1,
    )
    assert data["total_steps"] == 100_000 and data["steps"] == 100_000 // SPU * SPU
    assert [s["from_update"] for s in data["segments"]] == [0, resumed_from]
    assert data["wall_s"] == pytest.approx(sum(s["wall_s"] for s in data["segments"]), abs=0.2)
    curve = data["eval_curve"]
    assert curve and curve[-1][0] == data["steps"]  # the final evaluation is the last point
    assert data["final_return"] == pytest.approx(sum(r for _, r in curve[-3:]) / len(curve[-3:]))
    assert data["final_train_return"] > 0  # CartPole pays 1 per step
    assert data["command"].startswith("python -m podrace.cli train cartpole-ppo --env.id")
    assert "--checkpoint.every-updates" in data["command"]
    assert data["segments"][1]["command"].startswith("python -m podrace.cli train --resume")
    assert data["versions"]["jax"] and data["hardware"]["cores"]
    summary = json.loads((result.parent / "summary.json").read_text())
    assert summary["rows"][0]["final_returns"] == [data["final_return"]]

    before = result.read_bytes()
    third = subprocess.run(runner(tmp_path), env=env(), capture_output=True, text=True, timeout=120)
    assert third.returncode == 0 and "done (skipped)" in third.stdout, third.stdout
    assert result.read_bytes() == before
    listing = subprocess.run(
        runner(tmp_path, "--dry-run"), env=env(), capture_output=True, text=True, timeout=120
    )
    assert f"{RUN}: done" in listing.stdout


@pytest.mark.timeout(60)
def test_a_task_not_in_the_suite_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run(
        runner(tmp_path, "--tasks", "Pong-v5", "--dry-run"),
        env=env(),
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert proc.returncode == 2
    assert proc.stderr == (
        "learning: error: task 'Pong-v5' is not in suite 'smoke' (CartPole-v1)\n"
    )


@pytest.mark.timeout(60)
def test_an_extra_flag_the_suite_sets_is_refused_before_any_run(tmp_path):
    proc = subprocess.run(
        runner(tmp_path, "--", "--total-steps", "5000"),
        env=env(),
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert proc.returncode == 2
    assert proc.stderr == "learning: error: --total-steps is set by the suite for every run\n"
    assert not (tmp_path / "runs").exists()
