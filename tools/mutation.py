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
    python tools/mutation.py --list            # the mutants and the tests each one runs

With `-k` and `--json` together, the outcomes of the mutants re-run replace theirs in the
existing JSON file and the score is recomputed over every mutant listed there (so a fix can
be checked without a full pass). Mutants run one at a time: the suite's own threads and
JAX's compiler already use the cores, and parallel runs make timing-sensitive tests flaky.

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

COPIED = ("podrace", "tests", "pyproject.toml", "README.md", "docs")


@dataclass
class Outcome:
    name: str
    file: str
    status: str  # killed | timeout (both caught) | survived | stale | error (neither is scored)
    seconds: float
    detail: str = ""
    tests: tuple[str, ...] = ()


def _copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        elif src.exists():
            shutil.copy2(src, dest / name)


def baseline(tests: tuple[str, ...], timeout_s: float) -> str | None:
    """Run `tests` on the unmutated tree; None if they pass, else why not."""
    with tempfile.TemporaryDirectory(prefix="podrace-baseline-") as tmp:
        tree = Path(tmp)
        _copy_tree(tree)
        env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
        command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
        try:
            done = subprocess.run(
                command, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            return f"timed out after {timeout_s:g}s"
    if done.returncode == 0:
        return None
    return f"pytest exit {done.returncode}: {(done.stdout.strip().splitlines()[-1:] or [''])[0]}"


def run_mutant(mutant: Mutant, timeout_s: float) -> Outcome:
    source = (ROOT / mutant.file).read_text()
    count = source.count(mutant.find)
    if count != 1:
        return Outcome(
            mutant.name, mutant.file, "stale", 0.0, f"snippet found {count} times", mutant.tests
        )
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="podrace-mutant-") as tmp:
        tree = Path(tmp)
        _copy_tree(tree)
        (tree / mutant.file).write_text(source.replace(mutant.find, mutant.replace))
        env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-x",
            "-q",
            "-p",
            "no:cacheprovider",
            *mutant.tests,
        ]
        try:
            done = subprocess.run(
                command, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            # A hang under a mutant is a failure the suite would report (pytest-timeout).
            return Outcome(
                mutant.name, mutant.file, "timeout", time.monotonic() - start, "", mutant.tests
            )
    seconds = time.monotonic() - start
    tail = done.stdout.strip().splitlines()[-1:] or [""]
    if done.returncode == 0:
        return Outcome(mutant.name, mutant.file, "survived", seconds, tail[0], mutant.tests)
    if done.returncode in (4, 5):  # usage error / no test collected: a typo in `tests`, not a kill
        return Outcome(
            mutant.name,
            mutant.file,
            "error",
            seconds,
            f"pytest exit {done.returncode}: {tail[0]}",
            mutant.tests,
        )
    if done.returncode in (1, 3):  # tests failed / errored on the mutant
        return Outcome(mutant.name, mutant.file, "killed", seconds, tail[0], mutant.tests)
    return Outcome(
        mutant.name,
        mutant.file,
        "killed",
        seconds,
        f"pytest exit {done.returncode}: {tail[0]}",
        mutant.tests,
    )


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "-k", nargs="*", default=[], help="only mutants whose name contains one of these words"
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds per mutant's test run"
    )
    parser.add_argument("--json", type=Path, help="write the outcomes as JSON")
    parser.add_argument(
        "--list", action="store_true", help="list the selected mutants and their tests, run nothing"
    )
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="first run each distinct test selection on the unmutated tree; mutants whose tests "
        "already fail there are reported as errors instead of counted as killed",
    )
    args = parser.parse_args(argv)

    selected = [m for m in MUTANTS if not args.k or any(word in m.name for word in args.k)]
    if args.list:
        for m in selected:
            print(f"{m.name:48s} {m.file:32s} {' '.join(m.tests)}")
        return 0
    broken: dict[tuple[str, ...], str] = {}
    if args.baseline:
        for tests in dict.fromkeys(m.tests for m in selected):
            why = baseline(tests, args.timeout)
            print(
                f"baseline {'ok' if why is None else 'FAILS'}: {' '.join(tests)} {why or ''}",
                flush=True,
            )
            if why is not None:
                broken[tests] = why
    outcomes = []
    for i, mutant in enumerate(selected, 1):
        if mutant.tests in broken:
            outcome = Outcome(
                mutant.name,
                mutant.file,
                "error",
                0.0,
                f"fails unmutated: {broken[mutant.tests]}",
                mutant.tests,
            )
        else:
            outcome = run_mutant(mutant, args.timeout)
        outcomes.append(outcome)
        print(
            f"[{i}/{len(selected)}] {outcome.status:8s} {outcome.seconds:6.1f}s  {mutant.name}",
            flush=True,
        )

    if (
        args.json and args.k and args.json.exists()
    ):  # a partial re-run: merge into the last full pass
        known = {m.name for m in MUTANTS}
        rerun = {o.name for o in outcomes}
        previous = json.loads(args.json.read_text())["outcomes"]
        kept = [
            Outcome(**{**o, "tests": tuple(o.get("tests", ()))})
            for o in previous
            if o["name"] in known and o["name"] not in rerun
        ]
        order = {m.name: i for i, m in enumerate(MUTANTS)}
        outcomes = sorted(kept + outcomes, key=lambda o: order[o.name])
    scored = [o for o in outcomes if o.status not in ("stale", "error")]
    caught = [o for o in scored if o.status in ("killed", "timeout")]
    score = len(caught) / len(scored) if scored else 0.0
    print(f"\nmutation score: {len(caught)}/{len(scored)} = {score:.0%}")
    for o in outcomes:
        if o.status in ("survived", "stale", "error"):
            print(f"  {o.status}: {o.name} ({o.file}) {o.detail}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "score": round(score, 4),
            "killed": len(caught),
            "scored": len(scored),
            "stale": sum(o.status == "stale" for o in outcomes),
            "errors": sum(o.status == "error" for o in outcomes),
            "commit": _commit(),
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "outcomes": [asdict(o) for o in outcomes],
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
