"""Mutation score: plant realistic bugs one at a time and see whether the tests notice.

Each mutant in `tools/mutants.py` names a file, an exact snippet, its buggy replacement and
the tests that should catch it. For every mutant this script copies the working tree to a
temporary folder (the checkout is never modified, even on Ctrl-C), applies the one edit,
runs those tests with `pytest -x`, and counts the mutant as killed when they fail. A
snippet that no longer occurs exactly once is reported as stale (the code changed: update
the mutant) and is not scored.

    python tools/mutation.py                   # every mutant
    python tools/mutation.py -k actor sync     # mutants whose name contains a word
    python tools/mutation.py --json out.json   # also write the results as JSON

A development tool, not part of CI: a full pass runs the relevant tests once per mutant.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from mutants import MUTANTS, Mutant  # noqa: E402

COPIED = ("podrace", "tests", "pyproject.toml", "README.md")


@dataclass
class Outcome:
    name: str
    file: str
    status: str  # killed | survived | stale | timeout
    seconds: float
    detail: str = ""


def _copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        elif src.exists():
            shutil.copy2(src, dest / name)


def run_mutant(mutant: Mutant, timeout_s: float) -> Outcome:
    source = (ROOT / mutant.file).read_text()
    count = source.count(mutant.find)
    if count != 1:
        return Outcome(mutant.name, mutant.file, "stale", 0.0, f"snippet found {count} times")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="podrace-mutant-") as tmp:
        tree = Path(tmp)
        _copy_tree(tree)
        (tree / mutant.file).write_text(source.replace(mutant.find, mutant.replace))
        env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
        command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *mutant.tests]
        try:
            done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # A hang under a mutant is a failure the suite would report (pytest-timeout).
            return Outcome(mutant.name, mutant.file, "timeout", time.monotonic() - start)
    seconds = time.monotonic() - start
    tail = done.stdout.strip().splitlines()[-1:] or [""]
    if done.returncode == 0:
        return Outcome(mutant.name, mutant.file, "survived", seconds, tail[0])
    if done.returncode in (1, 3):  # tests failed / errored on the mutant
        return Outcome(mutant.name, mutant.file, "killed", seconds, tail[0])
    return Outcome(mutant.name, mutant.file, "killed", seconds, f"pytest exit {done.returncode}: {tail[0]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", nargs="*", default=[], help="only mutants whose name contains one of these words")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant's test run")
    parser.add_argument("--json", type=Path, help="write the outcomes as JSON")
    args = parser.parse_args(argv)

    selected = [m for m in MUTANTS if not args.k or any(word in m.name for word in args.k)]
    outcomes = []
    for i, mutant in enumerate(selected, 1):
        outcome = run_mutant(mutant, args.timeout)
        outcomes.append(outcome)
        print(f"[{i}/{len(selected)}] {outcome.status:8s} {outcome.seconds:6.1f}s  {mutant.name}", flush=True)

    scored = [o for o in outcomes if o.status != "stale"]
    caught = [o for o in scored if o.status in ("killed", "timeout")]
    score = len(caught) / len(scored) if scored else 0.0
    print(f"\nmutation score: {len(caught)}/{len(scored)} = {score:.0%}")
    for o in outcomes:
        if o.status in ("survived", "stale"):
            print(f"  {o.status}: {o.name} ({o.file}) {o.detail}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"score": score, "killed": len(caught), "scored": len(scored), "outcomes": [asdict(o) for o in outcomes]}
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
