"""The run directory: checked before anything starts, created once, never overwriting.

A default name (<preset>-s<seed>-<time>) gets a numeric suffix when another run took it
in the same second; an explicit `log.run_name` that exists is an error. Creation is the
atomic `mkdir`, so two runs racing for a name cannot both get it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

from podrace.config import ConfigError, TrainConfig

MIN_FREE_BYTES = 64 * 2**20
"""Free space a run needs at start (config, metrics lines, event files)."""


def default_name(cfg: TrainConfig) -> str:
    return f"{cfg.name}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_dir_path(cfg: TrainConfig) -> Path:
    return Path(cfg.log.run_dir) / (cfg.log.run_name or default_name(cfg))


def _existing_ancestor(path: Path) -> Path:
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent


def check_run_dir(cfg: TrainConfig) -> Path:
    """Raise ConfigError unless the run directory can be created fresh; touches nothing."""
    path = run_dir_path(cfg)
    if cfg.log.run_name and path.exists():
        raise ConfigError(f"run directory {path} already exists; choose another log.run-name")
    parent = _existing_ancestor(path)
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot create run directory {path}: {parent} is not a writable directory")
    free = shutil.disk_usage(parent).free
    if free < MIN_FREE_BYTES:
        raise ConfigError(
            f"cannot start a run in {parent}: {free / 2**20:.1f} MiB free, "
            f"at least {MIN_FREE_BYTES // 2**20} MiB needed"
        )
    return path


def create_run_dir(cfg: TrainConfig) -> Path:
    """Create the run directory (call only after every other check passed)."""
    path = check_run_dir(cfg)
    candidate, suffix = path, 1
    while True:
        try:
            candidate.parent.mkdir(parents=True, exist_ok=True)
            candidate.mkdir()
            return candidate
        except FileExistsError:
            if cfg.log.run_name:
                raise ConfigError(f"run directory {path} already exists; choose another log.run-name") from None
            suffix += 1
            candidate = path.with_name(f"{path.name}-{suffix}")
        except OSError as error:
            raise ConfigError(f"cannot create run directory {candidate}: {error.strerror}") from None


def remove_run_dir(path: Path) -> None:
    """Undo `create_run_dir` for a run that failed before it started training."""
    shutil.rmtree(path, ignore_errors=True)


def write_config(run_dir: Path, cfg: TrainConfig) -> None:
    """Write config.json (the resolved config); a failure is one line, not a traceback."""
    try:
        (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
    except OSError as error:
        raise ConfigError(f"cannot write {run_dir / 'config.json'}: {error.strerror}") from None
