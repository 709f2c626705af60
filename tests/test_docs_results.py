"""The figures a guide states are the ones its benchmark recorded."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(10)
def test_the_recurrent_guides_results_are_what_train_and_eval_recorded():
    recorded = json.loads((REPO / "benchmarks/results/recurrent_guide.json").read_text())
    guide = (REPO / "docs/guides/recurrent.md").read_text()
    rows = re.findall(r"^\| `(cartpole-po-ppo[-a-z]*)` seed (\d)[^|]*\|(.*)\|$", guide, re.M)
    expected = []
    for run in recorded["runs"]:
        evaluated = run["podrace_eval"]["return"]
        assert run["podrace_eval"]["episodes"] == 64
        expected.append(
            (
                run["preset"],
                str(run["seed"]),
                f"{run['env_steps_per_s'] / 1000:.1f}k",
                f"{run['final_eval']:.1f}",
                f"{evaluated['mean']:.1f} ({evaluated['min']:.0f}-{evaluated['max']:.0f})",
            )
        )
    stated = [(p, s, *(c.strip() for c in cells.split("|"))) for p, s, cells in rows]
    assert stated == expected


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "env_id,label",
    [("gymnax:Breakout-MinAtar", ""), ("craftax:Craftax-Classic-Symbolic-v1", "Craftax-Classic ")],
)
def test_the_jax_env_guides_curves_are_what_their_runs_recorded(env_id, label):
    recorded = json.loads((REPO / "benchmarks/results/jax_env_runs.json").read_text())
    (run,) = [r for r in recorded["runs"] if r["env_id"] == env_id]
    guide = (REPO / "docs/guides/jax-envs.md").read_text()
    steps_row = re.search(rf"^\| {label}env steps \|(.*)\|$", guide, re.M).group(1)
    returns_row = re.search(rf"^\| {label}evaluation return [^|]*\|(.*)\|$", guide, re.M).group(1)
    stated = [
        (step.strip(), float(value))
        for step, value in zip(steps_row.split("|"), returns_row.split("|"))
    ]
    assert stated == [(f"{s / 1e6:.1f}M", round(r, 1)) for s, r in run["eval_curve"]]
    assert f"{run['train_return_start']:.1f}" in guide and f"{run['train_return_end']:.1f}" in guide
