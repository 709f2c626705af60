"""A command's standard streams: its result on stdout, its errors on stderr, and what
happens when they cannot be written.

A command's work must not be lost to its streams: a full disk, a reader that has gone or
one that stopped reading, or a descriptor the process was started without. Where stdout
refuses the result, the exit code says so (1, one line on stderr); where stderr refuses a
line, the line is lost, never the run.
"""

from __future__ import annotations

import os
import sys

from podrace.runtime.stderr import fd_takes_writes


class _StderrThatDropsWhatItCannotWrite:
    """sys.stderr of a command: a full disk (`2>/dev/full`), a reader that has gone (`2>&1 |
    head -1`) or one that stopped reading loses the lines, not the run. Unguarded, the first
    warning raised in argument parsing (nothing ran, exit 1), rich's console ended a training
    run halfway (its broken-pipe handler raises SystemExit), and a full pipe held the main
    thread in a write, so no signal could end the process."""

    def __init__(self, stream) -> None:
        self._stream = stream
        try:
            self._fd: int | None = stream.fileno()
        except (OSError, ValueError, AttributeError):  # no descriptor: nothing to wait for
            self._fd = None

    def write(self, text: str) -> int:
        if not fd_takes_writes(self._fd):
            return len(text)
        try:
            return self._stream.write(text)
        except (OSError, ValueError):
            return len(text)

    def flush(self) -> None:
        if not fd_takes_writes(self._fd):
            return
        try:
            self._stream.flush()
        except (OSError, ValueError):
            pass  # a gone reader or a full disk refuses it: the run does not depend on it

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def guard_std_streams() -> None:
    """For a command's own process, first: a standard descriptor the process was started
    without (`>&-`, `2>&-`) is opened on /dev/null, so no file the run opens takes its number
    (a crash dump or a C library's log line would land in it) and sys.stdout and sys.stderr
    exist (tyro's help and errors use them), and stderr never fails or blocks for long."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stdout is None:
        sys.stdout = open(1, "w", closefd=False)
    if sys.stderr is None:  # Python's print(file=None) would use stdout
        sys.stderr = open(2, "w", closefd=False)
    if not isinstance(sys.stderr, _StderrThatDropsWhatItCannotWrite):
        sys.stderr = _StderrThatDropsWhatItCannotWrite(sys.stderr)


def print_error(message: str) -> int:
    """A user-facing error: one line on stderr; the exit code 2."""
    print(f"podrace: error: {message}", file=sys.stderr)
    return 2


def print_result(text: str) -> int:
    """A command's result on stdout; the exit code: 0, or 1 with one line on stderr where
    stdout refuses it (a full disk, a reader that has gone: `| head -0`), after the work
    itself succeeded. Nothing to do where the process was started with stdout closed."""
    if sys.stdout is None:
        return 0
    try:
        print(text)
        sys.stdout.flush()
    except (OSError, ValueError) as error:  # ValueError: stdout closed
        return stdout_refused(error)
    return 0


def stdout_refused(error: OSError | ValueError) -> int:
    """One line for what stdout refused after the command's work was done; the exit code 1."""
    reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    print(
        f"podrace: error: could not write to stdout ({reason}); the command itself succeeded",
        file=sys.stderr,
    )
    return 1


def flush_std_streams() -> None:
    """What is buffered for stdout and stderr, where they can still take it (None when the
    process was started with one closed; a full disk or a gone reader refuses it)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass  # refused (see above): what is left of it is lost with the stream
