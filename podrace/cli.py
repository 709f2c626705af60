"""`podrace` command line: `podrace train`, `podrace eval` and `podrace plot`.

Each command lives in its own module (`podrace.train_command`, `podrace.eval_command`,
`podrace.metrics.plot`); this one dispatches and turns a ConfigError into one line, exit 2.
"""

from __future__ import annotations

import signal
import sys
import warnings
from typing import Sequence

from podrace.config import ConfigError
from podrace.runtime.xla_setup import enable_compile_cache
from podrace.train_command import print_error, train_command

USAGE = """usage: podrace train <preset> [--flags]   (podrace train <preset> --help lists the flags)
       podrace train --resume RUN_DIR [--resume-from STEP] [--total-steps N ...]
       podrace eval RUN_DIR [--checkpoint STEP] [--episodes N] [--stochastic] [--video PATH]
       podrace plot RUN_DIR [RUN_DIR ...] -o out.png"""


def eval_command(args: Sequence[str]) -> int:
    """`podrace eval RUN_DIR`: a checkpoint's policy on fresh envs (see podrace.eval_command)."""
    import tyro

    from podrace.arguments import parse
    from podrace.eval_command import EvalOptions, evaluate_run, summary

    warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")
    enable_compile_cache()
    try:
        opts = parse(lambda: tyro.cli(EvalOptions, prog="podrace eval", args=list(args)))
        result = evaluate_run(opts)
    except ConfigError as error:
        return print_error(str(error))
    except KeyboardInterrupt:  # nothing half-written: the results JSON is written at the end, atomically
        print("podrace: SIGINT received, stopped", file=sys.stderr)
        return 128 + signal.SIGINT
    print(summary(result))
    return 0


def plot_command(args: Sequence[str]) -> int:
    """`podrace plot RUN_DIR [RUN_DIR ...] -o out.png` (see podrace.metrics.plot)."""
    import tyro

    from podrace.arguments import parse
    from podrace.metrics.plot import PlotOptions, check_output, plot_runs, save_figure

    try:
        opts = parse(lambda: tyro.cli(PlotOptions, prog="podrace plot", args=list(args)))
        check_output(opts.output)
        save_figure(plot_runs(opts.run_dirs), opts.output)
    except ConfigError as error:
        return print_error(str(error))
    print(f"wrote {opts.output}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "train":
        return train_command(rest)
    if command == "eval":
        return eval_command(rest)
    if command == "plot":
        return plot_command(rest)
    return print_error(f"unknown command '{command}'\n{USAGE}")


if __name__ == "__main__":
    sys.exit(main())
