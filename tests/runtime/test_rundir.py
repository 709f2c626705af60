"""The run directory: unique default names, checked before anything is written, removed
when the run fails before it starts, and config.json holding the resolved config."""

import json
import threading
from collections import namedtuple
from types import SimpleNamespace

import pytest

from podrace import rundir
from podrace.config import ConfigError, TrainConfig, replace
from podrace.rundir import check_new_run_dir, create_run_dir
from podrace.runtime import run as runs


def config(tmp_path, **changes):
    return replace(
        TrainConfig(name="t", seed=3), **{"log.run_dir": str(tmp_path / "runs"), **changes}
    )


@pytest.mark.timeout(30)
def test_runs_started_in_the_same_second_get_different_directories(tmp_path, monkeypatch):
    monkeypatch.setattr(rundir.time, "strftime", lambda fmt: "20260101-000000")
    cfg = config(tmp_path)
    made, barrier = [], threading.Barrier(4)

    def start():
        barrier.wait()
        made.append(create_run_dir(cfg))

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(made)) == 4
    assert sorted(p.name for p in made) == ["t-s3-20260101-000000"] + [
        f"t-s3-20260101-000000-{i}" for i in (2, 3, 4)
    ]


@pytest.mark.timeout(30)
def test_an_explicit_name_that_exists_is_refused(tmp_path):
    cfg = config(tmp_path, **{"log.run_name": "r"})
    create_run_dir(cfg)
    with pytest.raises(ConfigError, match="already exists"):
        check_new_run_dir(cfg)
    with pytest.raises(ConfigError, match="already exists"):
        create_run_dir(cfg)


@pytest.mark.timeout(30)
def test_a_full_disk_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(rundir.shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 4096, 4096))
    with pytest.raises(ConfigError, match=r"0\.0 MiB free, at least 64 MiB needed"):
        create_run_dir(config(tmp_path))
    assert not list(tmp_path.iterdir())


def stop_at_construction(monkeypatch, error=None):
    """Replace Run (compiling, starting envs) by a stand-in that returns what prepare()
    passed it, or raises `error`."""

    def fake(topology, cfg, spec, devices, run_dir, root, lifetime, envs, point, faults):
        if error is not None:
            raise error
        return SimpleNamespace(cfg=cfg, run_dir=run_dir)

    monkeypatch.setattr(runs, "Run", fake)


@pytest.mark.timeout(60)
def test_prepare_writes_the_resolved_config(tmp_path, monkeypatch):
    stop_at_construction(monkeypatch)
    cfg = config(tmp_path, deterministic=True, total_steps=4096, **{"layout.max_policy_lag": 2})
    run = runs.prepare(cfg)
    run.lock.release()
    effective, run_dir = run.cfg, run.run_dir
    written = json.loads((run_dir / "config.json").read_text())
    assert written["layout"]["synchronous"] is True
    assert written["layout"]["max_policy_lag"] == 0
    assert written["log"]["run_name"] == run_dir.name
    assert effective.layout.synchronous and effective.max_policy_lag == 0


@pytest.mark.timeout(60)
def test_a_run_that_fails_while_building_leaves_no_directory(tmp_path, monkeypatch):
    stop_at_construction(monkeypatch, RuntimeError("compile failed"))
    with pytest.raises(RuntimeError, match="compile failed"):
        runs.prepare(config(tmp_path, total_steps=4096))
    assert not list((tmp_path / "runs").iterdir())


@pytest.mark.timeout(60)
def test_a_network_too_large_for_memory_writes_nothing(tmp_path, monkeypatch):
    from podrace.runtime import memory

    monkeypatch.setattr(memory, "host_available_bytes", lambda: 100_000)  # ~25k float32 params
    with pytest.raises(
        ConfigError, match=r"the network has [\d,]+ parameters .* host memory has 0\.0 GiB"
    ):
        runs.prepare(config(tmp_path, total_steps=4096, **{"network.hidden_sizes": (128, 128)}))
    assert not (tmp_path / "runs").exists()


@pytest.mark.timeout(10)
def test_config_json_that_cannot_be_written_is_one_line(tmp_path):
    from podrace.rundir import write_config

    with pytest.raises(
        ConfigError, match=r"cannot write .*config.json: No such file or directory$"
    ):
        write_config(tmp_path / "gone", TrainConfig())


PROBE_SIGNALLED = """
import os, signal, sys, tempfile
from pathlib import Path
import podrace.commands.outputs as outputs
from podrace.commands.supervisor import exit_at_once_on_signals

made = tempfile.mkstemp

def signalled_after_making(*args, **kwargs):
    made_now = made(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGINT)  # between creating the probe and removing it
    return made_now

outputs.tempfile.mkstemp = signalled_after_making
with exit_at_once_on_signals():
    outputs.check_writable(Path(sys.argv[1]) / "out.json")
sys.exit(99)
"""


def test_a_signal_during_the_writability_probe_leaves_no_probe_file(tmp_path):
    """`podrace eval`'s signal exits at once: one between `check_writable` creating its probe
    file and removing it still leaves no probe file."""
    import signal
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", PROBE_SIGNALLED, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 128 + signal.SIGINT, done.stderr
    assert list(tmp_path.iterdir()) == []
