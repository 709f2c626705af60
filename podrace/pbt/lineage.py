"""A population's lineage, `RUN/pbt.jsonl`: one JSON line per exploit (which member copied
which, at which of its own env steps, its hyperparameters before and after).

A resumed population (or a member restarted after a failure,
`podrace.runtime.population_restarts`) continues each member from its checkpoint: lines a
member wrote after it (decisions it is about to take again) move to `pbt-superseded.jsonl`
before it resumes, so the file never holds a decision twice nor loses one the members'
states still carry.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

LINEAGE = "pbt.jsonl"
SUPERSEDED = "pbt-superseded.jsonl"


class Lineage:
    """Appends lineage lines to `RUN/pbt.jsonl`, whole lines only, from any member's thread."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LINEAGE
        self._lock = threading.Lock()

    def write(self, line: Mapping[str, object]) -> None:
        data = (json.dumps(line, sort_keys=True) + "\n").encode()
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, data)  # one append of a whole line
            finally:
                os.close(fd)

    def keep_member_until(self, member: int, steps: int) -> list[dict]:
        """`keep_member_until` while no member appends; the member's lines kept."""
        with self._lock:
            keep_member_until(self.path.parent, member, steps)
            return [line for line in read_lines(self.path.parent) if line["member"] == member]


def read_lines(run_dir: Path) -> list[dict]:
    """Every whole line of `RUN/pbt.jsonl` (none when it does not exist). Only the last line
    can be cut by a kill (each line is one append), so it alone is left out when it does not
    parse; a bad line before it is a damaged file: ValueError naming it."""
    path = Path(run_dir) / LINEAGE
    if not path.exists():
        return []
    texts = path.read_text(encoding="utf-8").splitlines()
    lines = []
    for number, text in enumerate(texts, 1):
        try:
            lines.append(json.loads(text))
        except ValueError:
            if number < len(texts):
                raise ValueError(f"{path}: line {number} is not JSON") from None
    return lines


def keep_until(run_dir: Path, member_steps: Mapping[int, int]) -> None:
    """Keep in `RUN/pbt.jsonl` only the lines each member wrote up to its env steps in
    `member_steps` (where it resumes); the others are appended to `pbt-superseded.jsonl`
    first (a kill in between leaves a line in both files, never in none)."""
    _keep(run_dir, lambda line: line["member_step"] <= member_steps.get(line["member"], -1))


def keep_member_until(run_dir: Path, member: int, steps: int) -> None:
    """`keep_until` for one member (it restarts from `steps`); every other member's lines
    stay. The caller holds the lineage's lock (`Lineage.keep_member_until`)."""
    _keep(run_dir, lambda line: line["member"] != member or line["member_step"] <= steps)


def _keep(run_dir: Path, past: Callable[[dict], bool]) -> None:
    path = Path(run_dir) / LINEAGE
    if not path.exists():
        return
    kept, superseded = [], []
    for text in path.read_text(encoding="utf-8").splitlines():
        try:
            keep = past(json.loads(text))
        except (ValueError, KeyError, TypeError):
            keep = False  # a line cut by a kill: not a decision the members carry
        (kept if keep else superseded).append(text + "\n")
    if not superseded:
        return
    with open(Path(run_dir) / SUPERSEDED, "a", encoding="utf-8") as f:
        f.write("".join(superseded))
    tmp = path.with_name(f".{path.name}.resume-tmp")
    try:
        tmp.write_text("".join(kept), encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


__all__ = ["LINEAGE", "SUPERSEDED", "Lineage", "keep_member_until", "keep_until", "read_lines"]
