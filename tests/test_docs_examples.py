"""The library guide's example (docs/guides/library.md) runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.cli import run_python

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "guides" / "library.md"


def library_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert len(blocks) == 1, "the library guide has one complete script"
    return blocks[0]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_library_example_trains_beyond_random(tmp_path):
    script = tmp_path / "train_match.py"
    script.write_text(library_example())
    proc = run_python(str(script), cwd=tmp_path, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = re.search(r"final greedy return ([\d.]+) of 8", proc.stdout)
    assert found, proc.stdout
    assert float(found.group(1)) >= 6.0  # a random policy gets 2
    assert list((tmp_path / "runs").glob("match-ppo-*/metrics.jsonl"))
