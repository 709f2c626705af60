"""A run's metric lines, for every runtime: the sinks the config asks for, one line every
`log.interval_s` while the run lasts and a last one marked `final`. A sink that fails
(a full disk, W&B gone) fails the run as component `logger`; the lines before stay."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

from podrace.config import TrainConfig
from podrace.control import Lifetime
from podrace.metrics.loggers import Sink, make_sinks
from podrace.metrics.registry import Metrics


class RunLog:
    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: Path,
        metrics: Metrics,
        lifetime: Lifetime,
        extra: Callable[[], Mapping[str, float]],
        time_offset: float = 0.0,
    ):
        """`extra()` adds runtime-specific values to every line; `time_offset` is the
        training time of the runs this one resumes (so `time_s` and `sps` continue)."""
        self.cfg, self.metrics, self.lifetime = cfg, metrics, lifetime
        self.extra, self.time_offset = extra, time_offset
        self.sinks: list[Sink] = make_sinks(cfg, run_dir)

    def write(self, start: float, final: bool = False) -> bool:
        """One line from the metrics; False if a sink failed (the run is failing)."""
        line = self.metrics.collect()
        line.update(self.extra())
        line["time_s"] = elapsed = self.time_offset + time.perf_counter() - start
        line["sps"] = line.get("env_steps", 0.0) / max(elapsed, 1e-9)
        if final:
            line["final"] = 1
        return all([self._guarded(sink.write, line) for sink in self.sinks])

    def until_stopped(self, start: float) -> None:
        """A line every interval until the run stops (or a sink fails)."""
        while not self.lifetime.wait(self.cfg.log.interval_s):
            if not self.write(start):
                return

    def close(self) -> None:
        for sink in self.sinks:
            self._guarded(sink.close)

    def _guarded(self, fn: Callable, *args: object) -> bool:
        try:
            fn(*args)
            return True
        except Exception as error:  # noqa: BLE001 - becomes the run's failure
            self.lifetime.fail("logger", error)
            return False
