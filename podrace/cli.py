"""`podrace` command line: `podrace train`, `podrace eval` and `podrace plot`.

Each command lives in its own module (`podrace.commands.train`, `podrace.commands.eval`,
`podrace.metrics.plot`); this one dispatches, turns a ConfigError into one line and exit 2,
prints podrace's log records as lines of their own, and handles signals around a command.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from podrace.commands.std_streams import guard_std_streams, print_error, print_result
from podrace.commands.supervisor import (
    end_at_once_on_signals,
    exit_at_once_on_signals,
    ignore_signals_from_now_on,
    leave,
)

USAGE = """usage: podrace train <preset> [--flags]   (podrace train <preset> --help lists the flags)
       podrace train --resume RUN_DIR [--resume-from STEP] [--total-steps N ...]
       podrace eval RUN_DIR [--checkpoint STEP] [--episodes N] [--stochastic] [--video PATH]
       podrace plot RUN_DIR [RUN_DIR ...] -o out.png"""


class _LineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"podrace: {record.levelname.lower()}: {record.getMessage()}"
        return f"{line}\n{self.formatException(record.exc_info)}" if record.exc_info else line


@contextmanager
def podrace_log_lines() -> Iterator[None]:
    """While a command runs, podrace's log records from INFO up are `podrace: info: ...`
    and `podrace: warning: ...` lines on stderr, like its errors, whatever handlers a
    dependency gave the root logger (one of them makes them `WARNING:podrace.evaluate:...`).
    INFO: events of a run worth a line (a Ray worker restarted or joined). Undone
    afterwards: a library user's logging is theirs."""
    logger = logging.getLogger("podrace")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LineFormatter())
    propagate, level = logger.propagate, logger.level
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
        logger.setLevel(level)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; its exit code. Without `argv` (the process's own command line), a
    signal ends the process in one line from here on (the imports above are the standard
    library's), and is ignored once the command is done (the exit code is the command's);
    the process then ends without interpreter finalization (`supervisor.leave`)."""
    entry = argv is None
    if entry:
        guard_std_streams()
        end_at_once_on_signals()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        shown = print_result(USAGE)
        return shown if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in ("train", "eval", "plot"):
        return print_error(f"unknown command '{command}'\n{USAGE}")
    with podrace_log_lines():
        if command == "train":
            from podrace.commands.train import train_command

            code = train_command(rest)
        else:
            with exit_at_once_on_signals():  # their outputs are written at their end, atomically
                if command == "eval":
                    from podrace.commands.eval import eval_command as run_command
                else:
                    from podrace.commands.plot import plot_command as run_command
                code = run_command(rest)
    if entry:
        ignore_signals_from_now_on()
        leave(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
