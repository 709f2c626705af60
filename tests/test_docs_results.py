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
