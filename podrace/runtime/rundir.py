"""The run directory: created once, never overwriting an earlier run's files."""

from __future__ import annotations

import os
import time
from pathlib import Path

from podrace.config import ConfigError, TrainConfig


def run_dir_path(cfg: TrainConfig) -> Path:
    name = cfg.log.run_name or f"{cfg.name}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path(cfg.log.run_dir) / name


def check_run_dir(cfg: TrainConfig) -> Path:
    """Raise ConfigError unless the run directory can be created fresh; touches nothing."""
    path = run_dir_path(cfg)
    if path.exists():
        raise ConfigError(f"run directory {path} already exists; choose another log.run-name")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot create run directory {path}: {parent} is not a writable directory")
    return path


def create_run_dir(cfg: TrainConfig) -> Path:
    path = check_run_dir(cfg)
    try:
        path.mkdir(parents=True)
    except OSError as error:
        raise ConfigError(f"cannot create run directory {path}: {error.strerror}") from None
    return path
