"""Command-line parsing with podrace's error convention: a bad flag is one line on stderr
and exit code 2, like every other user error.

tyro reports a bad argument in a multi-line box drawn for a terminal (the flag's help text,
every preset it appears in). `parse` keeps what says what is wrong and where to look, and
drops the rest; `--help` is printed as tyro draws it.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from collections.abc import Callable
from typing import TypeVar

from podrace.commands.std_streams import stdout_refused
from podrace.config import ConfigError

T = TypeVar("T")

_BORDER = "│"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DROPPED = ("Argument helptext:",)
_MORE = "[...]"
"""tyro's mark for suggestions it left out (with many presets): nothing to read on one line."""


def parse(parse_fn: Callable[[], T]) -> T:
    """`parse_fn()` (a tyro call); a parse error raises ConfigError with one line."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            result = parse_fn()
    except SystemExit as exit:
        if exit.code not in (0, None):
            raise ConfigError(one_line(captured.getvalue())) from None
        sys.stderr.write(captured.getvalue())
        raise
    except OSError as error:  # only printing --help writes: into a stdout that refuses it
        raise SystemExit(stdout_refused(error)) from None
    sys.stderr.write(captured.getvalue())  # warnings tyro printed on the way
    return result


def one_line(report: str) -> str:
    """tyro's error box as one line: the error, its suggestions, where the help is."""
    sections = _sections(report)
    if not sections:
        lines = [line.strip() for line in report.splitlines() if line.strip()]
        return lines[-1] if lines else "invalid arguments"
    help_hint = ""
    parts: list[str] = []
    for lines in sections:
        text = _join(lines)
        if text.startswith("For full helptext"):
            found = re.search(r"(podrace\b.*?--help)", text)
            help_hint = f" (see {found.group(1)})" if found else ""
        elif not text.startswith(_DROPPED):
            parts.append(text)
    return "; ".join(parts) + help_hint


def _sections(report: str) -> list[list[str]]:
    """The box's body lines (indentation kept), split at its horizontal rules. tyro draws
    with box characters when stdout is UTF-8, with spaces and dashes otherwise, and colours
    when stdout is a terminal."""
    lines = _ANSI.sub("", report).splitlines()
    if any(line.startswith("╭") for line in lines):
        body = [
            line.rstrip()[2:-2]
            for line in lines
            if line.startswith(_BORDER) and line.rstrip().endswith(_BORDER)
        ]
    else:  # " Title", " -----", then "  body" lines
        text = [line for line in lines if line.strip()]
        body = [line[2:] for line in text[2:]] if len(text) > 2 and _is_rule(text[1]) else []
    sections: list[list[str]] = [[]]
    for line in body:
        if _is_rule(line):
            sections.append([])
        elif line.strip():
            sections[-1].append(line.rstrip())
    return [section for section in sections if section]


def _is_rule(line: str) -> bool:
    return len(line.strip()) >= 3 and set(line.strip()) <= {"─", "-"}


def _join(lines: list[str]) -> str:
    """Top-level text joined, names indented once listed after it (each once), deeper
    indented help text dropped."""
    text: list[str] = []
    names: list[str] = []
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            text.append(line)
        elif indent <= 4 and line.strip() not in (*names, _MORE):
            names.append(line.strip())
    joined = re.sub(r" ([.,;:)}\]])", r"\1", " ".join(text))  # a wrapped line may start at "."
    return f"{joined} {', '.join(names)}" if names else joined
