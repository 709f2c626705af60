"""After SIGTERM, `podrace train` finishes writing its last checkpoint even when the write
outlasts the exit grace (a slow disk, a loaded machine), and exits with 128 + the signal."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from podrace.commands.supervisor import EXIT_GRACE_S
from tests.helpers.cli import start_train
from tests.waiting import wait_until

WRITE_S = 3 * EXIT_GRACE_S


def slow_writes_run(tmp_path: Path) -> subprocess.Popen:
    """`podrace train` of run `tmp_path/r` whose every checkpoint write takes WRITE_S longer."""
    code = (
        "import sys, time\n"
        "from podrace.checkpoints.files import Checkpointer\n"
        "write = Checkpointer._write\n"
        "def slow_write(self, *args, **kwargs):\n"
        f"    time.sleep({WRITE_S})\n"
        "    return write(self, *args, **kwargs)\n"
        "Checkpointer._write = slow_write\n"
        "from podrace.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    return start_train(tmp_path, script=code)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_last_checkpoint_slower_than_the_exit_grace_is_still_written(tmp_path):
    run_dir = tmp_path / "r"
    proc = slow_writes_run(tmp_path)
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
