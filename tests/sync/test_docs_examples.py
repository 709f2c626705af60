"""The weight sync guide's examples (docs/guides/weight-sync.md) run as written."""

from __future__ import annotations

import os
import re

import pytest

from tests.helpers.cli import run_python

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _examples() -> list[str]:
    with open(os.path.join(REPO, "docs", "guides", "weight-sync.md")) as f:
        text = f.read()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.timeout(10)
def test_the_guide_has_three_examples():
    assert len(_examples()) == 3


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("index", range(3))
def test_example_runs(index, tmp_path):
    script = tmp_path / f"example_{index}.py"
    script.write_text(_examples()[index])
    out = run_python(str(script), cwd=REPO, timeout=150)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "version" in out.stdout
