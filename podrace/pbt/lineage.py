"""A population's lineage, `RUN/pbt.jsonl`: one JSON line per exploit (which member copied
which, at which of its own env steps, its hyperparameters before and after).

A resumed population continues each member from its checkpoint: lines a member wrote after
it (decisions it is about to take again) move to `pbt-superseded.jsonl` before it resumes,
so the file never holds a decision twice nor loses one the members' states still carry.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
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
    path = Path(run_dir) / LINEAGE
    if not path.exists():
        return
    kept, superseded = [], []
    for text in path.read_text(encoding="utf-8").splitlines():
        try:
            line = json.loads(text)
            past = line["member_step"] <= member_steps.get(line["member"], -1)
        except (ValueError, KeyError, TypeError):
            past = False  # a line cut by a kill: not a decision the members carry
        (kept if past else superseded).append(text + "\n")
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


__all__ = ["LINEAGE", "SUPERSEDED", "Lineage", "keep_until", "read_lines"]
