"""Where metric lines go: a JSONL file, the console (progress bar or lines), TensorBoard.

Every sink takes the same flat dict once per log interval. The JSONL file is flushed on
every line so that a run that dies keeps everything written before the failure.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Protocol

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class Sink(Protocol):
    def write(self, line: dict[str, float]) -> None: ...
    def close(self) -> None: ...


class JsonlSink:
    def __init__(self, path: Path):
        self._file = open(path, "a", buffering=1)

    def write(self, line: dict[str, float]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in line.items()}
        self._file.write(json.dumps(clean, sort_keys=True) + "\n")
        self._file.flush()

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


def summary(line: dict[str, float]) -> str:
    """One short human line: steps, SPS, returns, lag."""

    def fmt(name: str, key: str, spec: str) -> str | None:
        value = line.get(key)
        return None if value is None else f"{name} {value:{spec}}"

    parts = [
        fmt("steps", "env_steps", ",.0f"),
        fmt("sps", "sps", ",.0f"),
        fmt("return", "episode/return", ".1f"),
        fmt("eval", "eval/return", ".1f"),
        fmt("lag", "lag/lag_mean", ".2f"),
        fmt("update", "version", ".0f"),
    ]
    return "  ".join(p for p in parts if p)


class ConsoleSink:
    """A live progress bar (mode `progress`) or one printed line per interval (`lines`)."""

    def __init__(self, mode: str, total_steps: int, console: Console | None = None):
        self.mode = mode
        self.console = console or Console(stderr=True)
        self._progress = None
        if mode == "progress":
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
            self._progress.update(self._task, completed=line.get("env_steps", 0), description=summary(line))
        elif self.mode == "lines":
            self.console.print(summary(line), highlight=False)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
