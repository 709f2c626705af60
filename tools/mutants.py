"""Realistic bugs for tools/mutation.py: one exact edit each, and the tests that should fail.

Keep snippets short but unique in their file; when the code changes, the tool reports a
mutant as stale instead of scoring it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]


MUTANTS: list[Mutant] = []
