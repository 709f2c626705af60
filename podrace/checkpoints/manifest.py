"""A checkpoint step's manifest: the size and SHA-256 of every file, written once the step's
files are (by `podrace.checkpoints.files`), and checked before anything reads the step:
every file present, of its size and digest."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from podrace import json_text
from podrace.checkpoints.steps import FORMAT
from podrace.config import ConfigError

MANIFEST = "podrace_manifest.json"


def write_manifest(step_dir: Path) -> None:
    """Record size and SHA-256 of every file of a complete step, and make it durable: the
    manifest and the step's directory are synced, as TensorStore syncs the files it wrote,
    so a machine crash after the rename cannot leave the latest step unverifiable."""
    files = {}
    for path in sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name != MANIFEST):
        files[path.relative_to(step_dir).as_posix()] = {
            "bytes": path.stat().st_size,
            "sha256": file_sha256(path),
        }
    with open(step_dir / MANIFEST, "w") as f:
        f.write(json.dumps({"format": FORMAT, "files": files}, indent=1) + "\n")
        f.flush()
        os.fsync(f.fileno())
    sync_directory(step_dir)


def sync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable (a crash of the machine must not undo it)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_manifest(step_dir: Path) -> None:
    """ConfigError naming the first file that is missing, truncated or altered.

    Every step podrace writes has its manifest from the moment it appears (see
    `podrace.checkpoints.files`), so a step without one was damaged, or left by a write of an
    older podrace killed before its manifest: either way it cannot be verified."""
    manifest_path = step_dir / MANIFEST
    if not manifest_path.is_file():
        raise ConfigError(
            f"corrupt checkpoint: {step_dir} has no {MANIFEST}, so its files cannot be verified "
            "(move the step out of the checkpoints folder to use an earlier one)"
        )
    try:
        files = _manifest_files(json_text.loads(manifest_path.read_bytes()))
    except (ValueError, KeyError, TypeError) as error:  # UnicodeDecodeError is a ValueError
        text = " ".join(str(error).split())[:200]
        raise ConfigError(
            f"corrupt checkpoint: {manifest_path} is not a valid manifest ({text})"
        ) from None
    except OSError as error:
        raise ConfigError(
            f"corrupt checkpoint: cannot read {manifest_path}: {error.strerror or error}"
        ) from None
    for name, expected in files.items():
        path = step_dir / name
        if not path.is_file():
            raise ConfigError(f"corrupt checkpoint: {path} is missing")
        size = path.stat().st_size
        if size != expected["bytes"]:
            raise ConfigError(
                f"corrupt checkpoint: {path} has {size} bytes, {expected['bytes']} were written"
            )
        if file_sha256(path) != expected["sha256"]:
            raise ConfigError(
                f"corrupt checkpoint: {path} differs from what was written (SHA-256 mismatch)"
            )
    for path in sorted(step_dir.rglob("*")):  # orbax reads what it finds, listed or not
        if (
            path.is_file()
            and path != manifest_path
            and path.relative_to(step_dir).as_posix() not in files
        ):
            raise ConfigError(
                f"corrupt checkpoint: {path} is not in the manifest "
                "(added after the checkpoint was written)"
            )


def _manifest_files(manifest: object) -> dict[str, dict]:
    """The manifest's {relative path: {"bytes": int, "sha256": hex}}; ValueError for any
    other shape."""
    files = manifest["files"] if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        raise ValueError(
            f"'files' must map file names to sizes and hashes, got {type(files).__name__}"
        )
    for name, entry in files.items():
        inside = not Path(name).is_absolute() and ".." not in Path(name).parts
        size = entry.get("bytes") if isinstance(entry, dict) else None
        digest = entry.get("sha256") if isinstance(entry, dict) else None
        if not (
            inside
            and isinstance(size, int)
            and not isinstance(size, bool)
            and size >= 0
            and isinstance(digest, str)
            and re.fullmatch(r"[0-9a-f]{64}", digest)
        ):
            raise ValueError(
                f"entry {name!r} must be a file in the checkpoint with 'bytes' and 'sha256', "
                f"got {json.dumps(entry)[:80]}"
            )
    if manifest.get("format") != FORMAT:
        raise ValueError(
            f"format {json.dumps(manifest.get('format'))[:20]}, this podrace writes {FORMAT}"
        )
    return files


__all__ = ["MANIFEST", "file_sha256", "sync_directory", "verify_manifest", "write_manifest"]
