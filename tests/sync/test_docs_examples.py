"""The weight sync guide's examples (docs/guides/weight-sync.md) run as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

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
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
    )
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "version" in out.stdout
