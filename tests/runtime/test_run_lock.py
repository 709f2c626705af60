"""RunLock: one process writes a run directory; a dead holder never blocks the next run."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from podrace.checkpoints.resume import Resume
from podrace.config import ConfigError, replace
from podrace.rundir import RunLock
from podrace.runtime.run import prepare
from tests.helpers.configs import small

HOLDER = textwrap.dedent("""
    import sys, time
    from podrace.rundir import RunLock
    lock = RunLock(sys.argv[1])
    print("held", flush=True)
    time.sleep(120)
""")


def files(path):
    return {p: p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.timeout(30)
def test_a_held_run_directory_is_refused_until_released(tmp_path):
    lock = RunLock(tmp_path)
    with pytest.raises(
        ConfigError, match=f"run directory {tmp_path} is in use by another podrace process"
    ):
        RunLock(tmp_path)
    lock.release()
    lock.release()  # idempotent
    RunLock(tmp_path).release()
    assert list(tmp_path.iterdir()) == []  # taking the lock writes nothing


@pytest.mark.timeout(60)
def test_the_lock_of_a_killed_process_is_dropped(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
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


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_resumed_run_holds_its_directory_against_another_resume(tmp_path):
    first = prepare(small(tmp_path, total_steps=2 * 8 * 16 * 2, **{"log.run_name": "r"}))
    first.run()
    longer = replace(first.cfg, total_steps=2 * 8 * 16 * 3)
    second = prepare(
        longer, resume=Resume(tmp_path / "r")
    )  # holds the directory until run() returns
    before = files(tmp_path / "r")
    with pytest.raises(ConfigError, match="in use by another podrace process"):
        prepare(longer, resume=Resume(tmp_path / "r"))
    with pytest.raises(ConfigError, match="in use"):
        RunLock(tmp_path / "r")
    assert files(tmp_path / "r") == before
    assert second.run().updates == 3
    RunLock(tmp_path / "r").release()  # released when run() returned


@pytest.mark.timeout(60)
def test_a_fork_child_that_outlives_a_killed_holder_does_not_keep_the_lock(tmp_path):
    """A process the run forked (an env's helper) shares the open lock file, yet does not keep
    the flock once the run is SIGKILLed: the run can be resumed."""
    code = textwrap.dedent("""
        import os, sys, time
        from podrace.rundir import RunLock
        lock = RunLock(sys.argv[1])
        if os.fork() == 0:  # a helper that outlives its parent
            os.write(1, b"child\\n")  # fork's after-in-child hooks have run by now
            time.sleep(60)
            os._exit(0)
        os.write(1, b"held\\n")  # one write each: the two lines never interleave
        time.sleep(120)
    """)
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        # Both lines, in either order: on a loaded machine the child may not have run at all
        # when the parent is killed (its copy of the lock is dropped when it first runs).
        assert sorted(holder.stdout.readline().strip() for _ in range(2)) == ["child", "held"]
        with pytest.raises(ConfigError, match="in use"):
            RunLock(tmp_path)
        os.kill(holder.pid, signal.SIGKILL)  # the run only, not its helper
        holder.wait(30)
        RunLock(tmp_path).release()
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(30)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_resume_point_is_read_only_once_the_directory_is_held(tmp_path, monkeypatch):
    """A resume reads its checkpoint only once it holds the lock, so one that waits (slow env
    construction) while another resume runs to the end never resumes from the stale point,
    which would move that run's final metrics line away."""
    import podrace.runtime.run as runs

    first = prepare(small(tmp_path, total_steps=2 * 8 * 16 * 2, **{"log.run_name": "r"}))
    first.run()
    read_point = runs.resume_point
    held_while_read = []

    def checking(resume, cfg):
        try:
            RunLock(resume.run_dir).release()
            held_while_read.append(False)
        except ConfigError:
            held_while_read.append(True)
        return read_point(resume, cfg)

    monkeypatch.setattr(runs, "resume_point", checking)
    run = prepare(replace(first.cfg, total_steps=2 * 8 * 16 * 3), resume=Resume(tmp_path / "r"))
    run.close_envs()
    run.lock.release()
    assert held_while_read == [True]
