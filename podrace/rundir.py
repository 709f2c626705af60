"""The run directory, in one place: check, create, lock, claim, discard.

- check: a new run's directory can be created fresh (`check_new_run_dir`); a resumed run's
  is a writable podrace run directory (`check_resumable_run_dir`). Both touch nothing.
- create: a default name (<preset>-s<seed>-<time>) gets a numeric suffix when another run
  took it in the same second; an explicit `log.run_name` that exists is an error. Creation
  is the atomic `mkdir`, so two runs racing for a name cannot both get it.
- lock: one process writes a run directory at a time (`RunLock`).
- claim: a new run's directory, once locked, gets its config.json (`claim_new_run_dir`).
- discard: a new run that finished no update leaves no directory (it could not be resumed).

One process writes a run directory at a time: a run holds an exclusive `flock` on its run
directory from before it writes anything there until it has returned. Without it a
`--resume` of a run that is still training (or two resumes at once) both write the
directory: one moves the other's metrics lines away, checkpoints of two runs interleave, a
half-written one can become the latest. The lock is on the directory itself, so taking it
writes nothing (a refused resume leaves the run as it was, a read-only run can be locked);
the kernel drops it when its holder exits in any way, SIGKILL included, so a dead run
never blocks a resume. An flock belongs to the open file, which a fork child shares: a
child (an env's helper process) that outlived a killed run would hold it on. So fork
children close their copy at once (the parent's lock stays).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import time
import weakref
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


def check_new_run_dir(cfg: TrainConfig) -> Path:
    """The path of `cfg`'s new run directory; ConfigError unless it can be created fresh."""
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
    path = check_new_run_dir(cfg)
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


def check_resumable_run_dir(run_dir: Path) -> None:
    """ConfigError unless `run_dir` is a writable podrace run directory; touches nothing."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"cannot resume {run_dir}: not a directory")
    if not (run_dir / "config.json").is_file():
        raise ConfigError(f"cannot resume {run_dir}: not a podrace run directory (no config.json)")
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot resume {run_dir}: the directory is not writable")


def discard_run_dir(path: Path) -> None:
    """Undo `create_run_dir` for a run that failed before it started training."""
    shutil.rmtree(path, ignore_errors=True)


def discard_if_untrained(run_dir: Path | None, updates: int | None) -> None:
    """Remove a new run's directory (`run_dir`: its Lifetime's, None for a resumed run) when
    it finished no update (`updates` 0, or None when the run was never built): it holds no
    checkpoint, so it could not be resumed. After a stop, as after one during start-up."""
    if run_dir is not None and not updates:
        discard_run_dir(run_dir)


def write_config(run_dir: Path, cfg: TrainConfig) -> None:
    """Write config.json (the resolved config); a failure is one line, not a traceback."""
    try:
        (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
    except OSError as error:
        raise ConfigError(
            f"cannot write {shown(run_dir / 'config.json')}: {error.strerror}"
        ) from None


def claim_new_run_dir(run_dir: Path, cfg: TrainConfig) -> RunLock:
    """Lock a new run's directory (just created) and write its config.json: the last step
    before the run is built, so nothing is written unless every check passed."""
    lock = RunLock(run_dir)
    try:
        write_config(run_dir, cfg)
    except BaseException:
        lock.release()
        raise
    return lock


class RunLock:
    """The held lock of one run directory; `release()` (idempotent) lets the next run in."""

    def __init__(self, run_dir: Path):
        try:
            fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as error:
            raise ConfigError(f"cannot lock run directory {run_dir}: {error.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(
                f"run directory {run_dir} is in use by another podrace process "
                "(a run still writing it); stop that run first"
            ) from None
        self._fd: int | None = fd
        _held.add(self)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_held: weakref.WeakSet[RunLock] = weakref.WeakSet()


def _drop_inherited() -> None:
    for lock in list(_held):
        lock.release()  # closes the child's descriptor only: no LOCK_UN, the parent keeps it


os.register_at_fork(after_in_child=_drop_inherited)


__all__ = [
    "RunLock",
    "check_new_run_dir",
    "check_resumable_run_dir",
    "claim_new_run_dir",
    "create_run_dir",
    "discard_if_untrained",
    "discard_run_dir",
    "shown",
    "write_config",
]
