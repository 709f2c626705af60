"""RunLock: one process writes a run directory; a dead holder never blocks the next run."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from podrace.config import ConfigError, replace
from podrace.runtime.resume import Resume
from podrace.runtime.run_lock import RunLock
from podrace.runtime.single_host import prepare
from tests.runtime.test_single_host import small

HOLDER = textwrap.dedent("""
    import sys, time
    from podrace.runtime.run_lock import RunLock
    lock = RunLock(sys.argv[1])
    print("held", flush=True)
    time.sleep(120)
""")


def files(path):
    return {p: p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.timeout(30)
def test_a_held_run_directory_is_refused_until_released(tmp_path):
    lock = RunLock(tmp_path)
    with pytest.raises(ConfigError, match=f"run directory {tmp_path} is in use by another podrace process"):
        RunLock(tmp_path)
    lock.release()
    lock.release()  # idempotent
    RunLock(tmp_path).release()
    assert list(tmp_path.iterdir()) == []  # taking the lock writes nothing


@pytest.mark.timeout(60)
def test_the_lock_of_a_killed_process_is_dropped(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match="in use by another podrace process"):
            RunLock(tmp_path)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(30)
        RunLock(tmp_path).release()
    finally:
        holder.kill()
        holder.wait(30)


@pytest.mark.timeout(180)
def test_a_resumed_run_holds_its_directory_against_another_resume(tmp_path):
    first = prepare(small(tmp_path, total_steps=2 * 8 * 16 * 2, **{"log.run_name": "r"}))
    first.run()
    longer = replace(first.cfg, total_steps=2 * 8 * 16 * 3)
    second = prepare(longer, resume=Resume(tmp_path / "r"))  # holds the directory until run() returns
    before = files(tmp_path / "r")
    with pytest.raises(ConfigError, match="in use by another podrace process"):
        prepare(longer, resume=Resume(tmp_path / "r"))
    with pytest.raises(ConfigError, match="in use"):
        RunLock(tmp_path / "r")
    assert files(tmp_path / "r") == before
    assert second.run().updates == 3
    RunLock(tmp_path / "r").release()  # released when run() returned
