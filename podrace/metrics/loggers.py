"""Where metric lines go: a JSONL file, the console, TensorBoard, Weights & Biases.

Every sink takes the same flat dict once per log interval, so every sink shows the same
metric names. The JSONL file gets whole lines only: each line is one write, and a failed
write (disk full, file gone) is cut back to the last whole line. A sink's first failure
is raised as `SinkError` (the runtime reports it as the component `logger`); the broken
sink then ignores later lines, so that the shutdown's final line does not fail twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rich.console import Console

from podrace import json_text
from podrace.config import ConfigError, LogConfig, TrainConfig, resolved
from podrace.control import ExplainedError


class SinkError(ExplainedError, RuntimeError):
    """A metrics sink could not write (one line naming the sink and the cause)."""


class Sink(Protocol):
    def write(self, line: dict[str, float]) -> None: ...
    def close(self) -> None: ...


def _reason(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return f"{type(error).__name__}: {error}".splitlines()[0]


class JsonlSink:
    """One JSON object per line, appended and flushed per line; never a partial line. A file
    deleted under the run (with its run directory, say) is a failure, not lines written on
    into a file that no longer has a name."""

    def __init__(self, path: Path):
        self.path = path
        self._file = open(path, "ab", buffering=0)

    def write(self, line: dict[str, float]) -> None:
        data = (json_text.dumps_strict(line, sort_keys=True) + "\n").encode()
        stat = os.fstat(self._file.fileno())
        if stat.st_nlink == 0:  # deleted: lines written now would go nowhere anyone can read
            how = "" if self.path.parent.is_dir() else ", with the run directory"
            raise SinkError(f"cannot write metrics to {self.path}: the file was deleted{how}")
        start = stat.st_size
        try:
            view = memoryview(data)
            while view:  # a raw write may be partial
                view = view[self._file.write(view) :]
        except OSError as error:
            try:
                self._file.truncate(start)
            except OSError:
                pass  # the error below names the cause; the next line starts after it anyway
            raise SinkError(f"cannot write metrics to {self.path}: {_reason(error)}") from error

    def close(self) -> None:
        self._file.close()


class TensorBoardSink:
    def __init__(self, log_dir: Path):
        from tensorboardX import SummaryWriter

        self._writer = SummaryWriter(str(log_dir))

    def write(self, line: dict[str, float]) -> None:
        step = int(line.get("env_steps", 0))
        for name, value in line.items():
            if isinstance(value, (int, float)) and name != "env_steps":
                self._writer.add_scalar(name, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def import_wandb():
    """The wandb module, imported only when a run asks for it."""
    try:
        import wandb
    except ImportError:
        raise ConfigError(
            "log.wandb needs the wandb package: pip install 'podrace[wandb]'"
        ) from None
    return wandb


class WandbSink:
    """A Weights & Biases run logging the same names as metrics.jsonl, against env_steps."""

    def __init__(self, cfg: TrainConfig, run_dir: Path):
        wandb = import_wandb()
        self._run = wandb.init(
            project=cfg.log.wandb_project,
            name=run_dir.name,
            dir=str(run_dir),
            config=dataclasses.asdict(resolved(cfg)),
        )
        self._run.define_metric("*", step_metric="env_steps")

    def write(self, line: dict[str, float]) -> None:
        self._run.log({k: v for k, v in line.items() if isinstance(v, (int, float))})

    def close(self) -> None:
        self._run.finish()


def summary(line: dict[str, float]) -> str:
    """One short human line: steps, SPS, returns, lag, skipped updates."""

    def fmt(name: str, key: str, spec: str) -> str | None:
        value = line.get(key)
        return None if value is None else f"{name} {value:{spec}}"

    parts = [
        f"steps {line.get('env_steps', 0.0):,.0f}",  # also before the first one is counted
        fmt("sps", "sps", ",.0f"),
        fmt("return", "episode/return", ".1f"),
        fmt("eval", "eval/return", ".1f"),
        fmt("lag", "lag/lag_mean", ".2f"),
        fmt("update", "version", ".0f"),
    ]
    if line.get("learner/skipped_nonfinite"):
        parts.append(fmt("skipped", "learner/skipped_nonfinite", ".0f"))
    return "  ".join(p for p in parts if p)


class ConsoleSink:
    """A live progress bar (mode `progress`) or one printed line per interval (`lines`).

    A progress bar needs a terminal: on anything else (a file, a pipe, a CI log) it would
    be cut to the default width, so the sink prints plain lines instead.
    """

    def __init__(self, mode: str, total_steps: int, console: Console | None = None):
        # rich is imported here, not with the module: a run without console output (and
        # `import podrace`) does not pay its import time (measured 0.1-0.3 s on 2 cores).
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self.mode = "lines" if mode == "progress" and not self.console.is_terminal else mode
        self._progress = None
        if self.mode == "progress":
            from rich.progress import (
                BarColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]podrace"),
                BarColumn(),
                TextColumn("{task.percentage:>3.0f}%"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.description}"),
                console=self.console,
                transient=False,
            )
            self._task = self._progress.add_task("", total=total_steps)
            self._progress.start()

    def write(self, line: dict[str, float]) -> None:
        if self._progress is not None:
            self._progress.update(
                self._task, completed=line.get("env_steps", 0), description=summary(line)
            )
        elif self.mode == "lines":
            self.console.print(summary(line), highlight=False, markup=False, soft_wrap=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


class Guarded:
    """Raises a sink's first failure as SinkError, then drops its later lines."""

    def __init__(self, name: str, sink: Sink):
        self.name, self.sink, self.failed = name, sink, False

    def write(self, line: dict[str, float]) -> None:
        if self.failed:
            return
        try:
            self.sink.write(line)
        except Exception as error:
            self.failed = True
            if isinstance(error, SinkError):
                raise
            raise SinkError(f"{self.name} sink failed: {_reason(error)}") from error

    def close(self) -> None:
        try:
            self.sink.close()
        except Exception as error:
            if not self.failed:
                self.failed = True
                raise SinkError(f"{self.name} sink failed to close: {_reason(error)}") from error


def check_sinks(log: LogConfig) -> None:
    """ConfigError now for a sink that could not start later (e.g. wandb not installed)."""
    if log.wandb:
        import_wandb()


def make_sinks(cfg: TrainConfig, run_dir: Path) -> list[Sink]:
    """Every sink the config asks for, each guarded (failures raise SinkError once).

    A sink that cannot start (file not creatable, W&B refusing the run) raises SinkError
    after closing the ones already started.
    """
    factories: list[tuple[str, Callable[[], Sink]]] = [
        ("metrics.jsonl", lambda: JsonlSink(run_dir / "metrics.jsonl"))
    ]
    if cfg.log.tensorboard:
        factories.append(("tensorboard", lambda: TensorBoardSink(run_dir / "tensorboard")))
    if cfg.log.wandb:
        factories.append(("wandb", lambda: WandbSink(cfg, run_dir)))
    if cfg.log.console != "none":
        factories.append(("console", lambda: ConsoleSink(cfg.log.console, cfg.total_steps)))
    sinks: list[Sink] = []
    for name, factory in factories:
        try:
            sinks.append(Guarded(name, factory()))
        except Exception as error:
            for sink in sinks:
                with contextlib.suppress(
                    Exception
                ):  # the start-up error below is the one to report
                    sink.close()
            raise SinkError(f"{name} sink could not start: {_reason(error)}") from error
    return sinks
