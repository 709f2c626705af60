"""docs/results.md is what `benchmarks/learning.py --report` makes of the committed result
JSONs, and the report shows every seed, the mean +- std and whether the target is met."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[1]


def report(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "learning.py"), "--report", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=100,
    )


def fake_result(results: Path, task: str, preset: str, seed: int, final: float) -> Path:
    """A result JSON with the fields the report reads (as benchmarks/learning.py writes)."""
    name = f"{preset}__{task.replace('/', '-')}__s{seed}.json"
    path = results / "minatar" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "suite": "minatar",
        "preset": preset,
        "task": task,
        "seed": seed,
        "final_return": final,
        "final_return_rule": "mean of the last 3 evaluations",
        "final_train_return": final - 1.0,
        "eval_curve": [[0, 0.0], [2_500_000, final / 2], [5_000_000, final]],
        "wall_s": 600.0 + seed,
        "steps_per_s": 8333.3,
        "hardware": {"cpu": "Test CPU", "cores": 2, "gpus": []},
        "versions": {"podrace": "0123456789abcdef"},
    }
    path.write_text(json.dumps(data))
    return path


@pytest.mark.timeout(120)
def test_the_results_page_is_what_the_committed_results_give():
    proc = report("--check")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.timeout(120)
def test_the_report_shows_each_seed_the_mean_and_whether_the_target_is_met(tmp_path):
    results, docs = tmp_path / "results", tmp_path / "docs"
    for seed, final in ((1, 18.0), (2, 20.0), (3, 22.0)):
        fake_result(results, "MinAtar/Breakout-v1", "minatar-ppo", seed, final)
    changed = fake_result(results, "MinAtar/SpaceInvaders-v1", "minatar-impala", 1, 50.0)

    made = report("--results", str(results), "--docs", str(docs))
    assert made.returncode == 0, made.stderr
    page = (docs / "results.md").read_text()
    assert (
        "| MinAtar/Breakout-v1 | minatar-ppo | 5M steps | 3 | 20.0 ± 1.6 | 18.0, 20.0, 22.0 "
        "| ≥ 17.5 | yes | 19.0 |"
    ) in page
    assert (
        "| MinAtar/SpaceInvaders-v1 | minatar-impala | 5M steps | 1 | 50.0 (one seed) | 50.0 "
        "| ≥ 100 | no | 49.0 |"
    ) in page
    assert "| MinAtar/Asterix-v1 | minatar-ppo | 5M steps | 0 | not run yet |" in page
    assert "| MinAtar/Breakout-v1 | minatar-ppo | 1 | Test CPU, 2 cores, no GPU | 601 |" in page
    assert "![MinAtar at 5M steps (the MinAtar paper's budget)" in page
    assert "## MuJoCo at 1M steps" in page and "CartPole" not in page  # smoke: not reported
    assert Image.open(docs / "results" / "minatar.png").format == "PNG"
    assert not (docs / "results" / "mujoco.png").exists()  # no results, no figure

    assert report("--results", str(results), "--docs", str(docs), "--check").returncode == 0
    fake_result(results, "MinAtar/SpaceInvaders-v1", "minatar-impala", 1, 120.0)
    assert changed.is_file()
    stale = report("--results", str(results), "--docs", str(docs), "--check")
    assert stale.returncode == 1 and "differs from what the results give" in stale.stderr
