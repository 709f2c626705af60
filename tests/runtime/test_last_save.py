"""After SIGTERM, `podrace train` finishes writing its last checkpoint even when the write
outlasts the exit grace (a slow disk, a loaded machine), and exits with 128 + the signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from podrace.commands.supervisor import EXIT_GRACE_S
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
WRITE_S = 3 * EXIT_GRACE_S


def slow_writes_run(run_dir: Path) -> subprocess.Popen:
    """`podrace train` whose every checkpoint write takes WRITE_S longer."""
    code = (
        "import sys, time\n"
        "from podrace.checkpoints.files import Checkpointer\n"
        "write = Checkpointer._write\n"
        "def slow_write(self, *args, **kwargs):\n"
        f"    time.sleep({WRITE_S})\n"
        "    return write(self, *args, **kwargs)\n"
        "Checkpointer._write = slow_write\n"
        "from podrace.cli import main\n"
        f"sys.exit(main(['train', 'cartpole-ppo', '--log.run-dir', {str(run_dir.parent)!r},\n"
        f"    '--log.run-name', {run_dir.name!r}, '--log.console', 'none',\n"
        "    '--log.interval-s', '0.2']))\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_last_checkpoint_slower_than_the_exit_grace_is_still_written(tmp_path):
    run_dir = tmp_path / "r"
    proc = slow_writes_run(run_dir)
    try:
        metrics = run_dir / "metrics.jsonl"
        wait_until(
            lambda: (
                proc.poll() is not None
                or (metrics.exists() and metrics.read_text().count("\n") >= 2)
            ),
            timeout=120,
        )
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err
    steps = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert len(steps) == 1, (steps, err)
    assert f"checkpoint {steps[0]} saved" in err, err
    assert "left behind" not in err, err
