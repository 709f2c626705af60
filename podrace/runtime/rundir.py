"""The run directory: checked before anything starts, created once, never overwriting.

A default name (<preset>-s<seed>-<time>) gets a numeric suffix when another run took it
in the same second; an explicit `log.run_name` that exists is an error. Creation is the
atomic `mkdir`, so two runs racing for a name cannot both get it.
"""

from __future__ import annotations

import contextlib
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


def shown(path: Path) -> str:
    """The path for a one-line message (a path of thousands of characters is cut)."""
    text = str(path)
    return text if len(text) <= 120 else f"{text[:60]}...{text[-40:]}"


def check_run_dir(cfg: TrainConfig) -> Path:
    """Raise ConfigError unless the run directory can be created fresh; touches nothing."""
    path = run_dir_path(cfg)
    try:
        exists = path.exists()
        parent = _existing_ancestor(path)
        writable = parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)
        free = shutil.disk_usage(parent).free if writable else 0
    except OSError as error:  # e.g. a path or name too long for the file system
        raise ConfigError(f"cannot create run directory {shown(path)}: {error.strerror}") from None
    if cfg.log.run_name and exists:
        raise ConfigError(
            f"run directory {shown(path)} already exists; choose another log.run-name"
        )
    if not writable:
        raise ConfigError(
            f"cannot create run directory {shown(path)}: {shown(parent)} is not a writable "
            "directory"
        )
    if free < MIN_FREE_BYTES:
        raise ConfigError(
            f"cannot start a run in {shown(parent)}: {free / 2**20:.1f} MiB free, "
            f"at least {MIN_FREE_BYTES // 2**20} MiB needed"
        )
    return path


def create_run_dir(cfg: TrainConfig) -> Path:
    """Create the run directory (call only after every other check passed). If that fails,
    the parent folders it created are removed again."""
    path = check_run_dir(cfg)
    missing = [p for p in reversed(path.parents) if not p.exists()]  # outermost first
    try:
        return _make_unique(path, unique=not cfg.log.run_name)
    except ConfigError:
        for folder in reversed(missing):
            with contextlib.suppress(OSError):  # not empty: another run is using it
                folder.rmdir()
        raise


def _make_unique(path: Path, unique: bool) -> Path:
    candidate, suffix = path, 1
    while True:
        try:
            candidate.parent.mkdir(parents=True, exist_ok=True)
            candidate.mkdir()
            return candidate
        except FileExistsError:
            if not unique:
                raise ConfigError(
                    f"run directory {shown(path)} already exists; choose another log.run-name"
                ) from None
            suffix += 1
            candidate = path.with_name(f"{path.name}-{suffix}")
        except OSError as error:
            raise ConfigError(
                f"cannot create run directory {shown(candidate)}: {error.strerror}"
            ) from None


def remove_run_dir(path: Path) -> None:
    """Undo `create_run_dir` for a run that failed before it started training."""
    shutil.rmtree(path, ignore_errors=True)


def discard_if_untrained(run_dir: Path | None, updates: int | None) -> None:
    """Remove a new run's directory (`run_dir`: its Lifetime's, None for a resumed run) when
    it finished no update (`updates` 0, or None when the run was never built): it holds no
    checkpoint, so it could not be resumed. After a stop, as after one during start-up."""
    if run_dir is not None and not updates:
        remove_run_dir(run_dir)


def write_config(run_dir: Path, cfg: TrainConfig) -> None:
    """Write config.json (the resolved config); a failure is one line, not a traceback."""
    try:
        (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
    except OSError as error:
        raise ConfigError(
            f"cannot write {shown(run_dir / 'config.json')}: {error.strerror}"
        ) from None
