"""What a learning result was measured on: the machine and the software, for its JSON."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from importlib import metadata

from learning_suites import REPO

PACKAGES = ("jax", "jaxlib", "flax", "optax", "envpool", "minatar", "gymnasium", "numpy")


def cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo (Linux), else what `platform` says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def gpus() -> list[str]:
    """Names of the NVIDIA GPUs `nvidia-smi` lists (none without the tool)."""
    if shutil.which("nvidia-smi") is None:
        return []
    proc = subprocess.run(
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return [line.strip() for line in proc.stdout.splitlines() if line.strip()]


def hardware() -> dict:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "gpus": gpus(),
        "platform": platform.platform(),
    }


def _git(*args: str) -> str:
    proc = subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30
    )
    return proc.stdout.strip() if proc.returncode == 0 else ""


def podrace_commit() -> str | None:
    """HEAD of the podrace checkout, with "+dirty" when podrace/ has uncommitted changes."""
    commit = _git("rev-parse", "HEAD")
    if not commit:
        return None
    return commit + ("+dirty" if _git("status", "--porcelain", "--", "podrace") else "")


def versions() -> dict:
    found: dict[str, str | None] = {"podrace": podrace_commit()}
    for package in PACKAGES:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    found["python"] = platform.python_version()
    return found
