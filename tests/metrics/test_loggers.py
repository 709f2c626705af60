"""Metric sinks: whole lines only, one named error on failure, console without a terminal,
W&B with the same names (a fake wandb module stands in for the real one)."""

import errno
import io
import json
import sys

import pytest
from rich.console import Console

from podrace.config import ConfigError, LogConfig, TrainConfig, replace
from podrace.metrics.loggers import (
    ConsoleSink,
    Guarded,
    JsonlSink,
    SinkError,
    check_sinks,
    make_sinks,
    summary,
)

LINE = {
    "env_steps": 1024.0,
    "sps": 5000.0,
    "episode/return": 21.5,
    "learner/loss": float("nan"),
    "version": 2,
}


class FullDisk:
    """Wraps the sink's file: the next write stores `keep` bytes, then the disk is full."""

    def __init__(self, file, keep: int):
        self.file, self.keep = file, keep

    def write(self, data):
        if self.keep:
            written = self.file.write(bytes(data[: self.keep]))
            self.keep = 0
            return written
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self.file, name)


@pytest.mark.timeout(10)
def test_a_full_disk_leaves_only_whole_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    sink = JsonlSink(path)
    sink.write(LINE)
    sink._file = FullDisk(sink._file, keep=7)
    with pytest.raises(
        SinkError, match="cannot write metrics to .*metrics.jsonl: No space left on device"
    ):
        sink.write({**LINE, "env_steps": 2048.0})
    sink.close()
    text = path.read_text()
    assert text.endswith("\n") and text.count("\n") == 1
    assert json.loads(text) == {**LINE, "learner/loss": None}


@pytest.mark.timeout(10)
def test_a_failed_sink_raises_once_then_drops_lines(tmp_path):
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    sink._file = FullDisk(sink._file, keep=0)
    guarded = Guarded("metrics.jsonl", sink)
    with pytest.raises(SinkError):
        guarded.write(LINE)
    guarded.write(LINE)  # the shutdown's final line: no second error
    guarded.close()


@pytest.mark.timeout(10)
def test_any_sink_failure_becomes_a_sink_error():
    class Broken:
        def write(self, line):
            raise PermissionError(errno.EACCES, "Permission denied")

        def close(self):
            pass

    with pytest.raises(SinkError, match="tensorboard sink failed: Permission denied"):
        Guarded("tensorboard", Broken()).write(LINE)


@pytest.mark.timeout(10)
def test_progress_falls_back_to_whole_plain_lines_without_a_terminal():
    out = io.StringIO()
    sink = ConsoleSink("progress", total_steps=10**9, console=Console(file=out, width=20))
    long_line = {**LINE, "env_steps": 123_456_789.0, "eval/return": 499.5, "lag/lag_mean": 0.75}
    sink.write(long_line)
    sink.close()
    assert sink.mode == "lines"
    assert out.getvalue() == summary(long_line) + "\n"
    assert "steps 123,456,789" in out.getvalue() and "…" not in out.getvalue()


@pytest.mark.timeout(10)
def test_summary_shows_skipped_updates_only_when_there_are_some():
    assert "skipped" not in summary({**LINE, "learner/skipped_nonfinite": 0.0})
    assert "skipped 7" in summary({**LINE, "learner/skipped_nonfinite": 7.0})


@pytest.mark.timeout(30)
def test_wandb_logs_the_same_names_as_the_jsonl_file(tmp_path, fake_wandb):
    cfg = replace(
        TrainConfig(), **{"log.wandb": True, "log.console": "none", "log.wandb_project": "p"}
    )
    sinks = make_sinks(cfg, tmp_path)
    for sink in sinks:
        sink.write(LINE)
    for sink in sinks:
        sink.close()
    (run,) = fake_wandb.runs
    assert run.init["project"] == "p" and run.init["name"] == tmp_path.name
    assert run.init["config"]["log"]["wandb"] is True
    assert run.step_metrics == [("*", "env_steps")]
    jsonl = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert set(run.logged[0]) == set(jsonl) == set(LINE)
    assert run.finished


@pytest.mark.timeout(10)
def test_wandb_not_installed_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with pytest.raises(
        ConfigError, match=r"log.wandb needs the wandb package: pip install 'podrace\[wandb\]'"
    ):
        check_sinks(LogConfig(wandb=True))
    check_sinks(LogConfig(wandb=False))


@pytest.mark.timeout(30)
def test_a_sink_that_cannot_start_is_a_sink_error(tmp_path, fake_wandb):
    def refuse(**kwargs):
        raise ConnectionError("api.wandb.ai unreachable")

    fake_wandb.init = refuse
    cfg = replace(TrainConfig(), **{"log.wandb": True, "log.console": "none"})
    with pytest.raises(
        SinkError, match="wandb sink could not start: ConnectionError: api.wandb.ai unreachable"
    ):
        make_sinks(cfg, tmp_path)
    with pytest.raises(
        SinkError, match="metrics.jsonl sink could not start: No such file or directory"
    ):
        make_sinks(cfg, tmp_path / "gone")


def test_a_line_before_the_first_env_step_says_steps_0():
    """A Ray run's first console line (its workers still starting) says steps 0, not a bare
    "sps 0"."""
    assert summary({"sps": 0.0, "time_s": 1.0}) == "steps 0  sps 0"
