"""`podrace plot RUN_DIR [RUN_DIR ...] -o out.png [--reference VALUE:LABEL ...]`: learning
curves (seeds of one configuration as mean and range), published figures as lines, and
time breakdowns (drawn by `podrace.metrics.plot`) written to one image."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from podrace.commands.outputs import check_writable
from podrace.commands.std_streams import print_error, print_result
from podrace.commands.supervisor import signals_deferred
from podrace.config import ConfigError
from podrace.metrics.plot import DPI


def plot_command(args: Sequence[str]) -> int:
    """`podrace plot RUN_DIR [RUN_DIR ...] -o out.png`; its exit code."""
    import tyro

    from podrace.commands.arguments import parse
    from podrace.metrics.plot import PlotOptions

    try:
        opts = parse(lambda: tyro.cli(PlotOptions, prog="podrace plot", args=list(args)))
        check_output(opts.output)
        save_figure(_figure(opts), opts.output)
    except ConfigError as error:
        return print_error(str(error))
    return print_result(f"wrote {opts.output}")


def _figure(opts) -> Figure:
    """A population's figure for one population's run directory (`podrace.metrics.pbt_plot`),
    else the runs' learning curves and time breakdowns."""
    from podrace.metrics.pbt_plot import plot_population, population_config
    from podrace.metrics.plot import plot_runs

    populations = [population_config(d) for d in opts.run_dirs]
    if not any(populations):
        return plot_runs(opts.run_dirs, opts.references())
    if len(opts.run_dirs) > 1:
        raise ConfigError(
            "podrace plot draws one population at a time (or its members: RUN/member-<i> ...)"
        )
    return plot_population(opts.run_dirs[0], populations[0])


def check_output(path: Path) -> None:
    """ConfigError unless matplotlib can write `path`'s format and a file can be written
    there: not a directory, in a directory that takes a new file (checked by creating one)."""
    formats = Figure().canvas.get_supported_filetypes()
    if path.suffix.lower().lstrip(".") not in formats:
        raise ConfigError(
            f"cannot write {path}: use one of {', '.join('.' + f for f in sorted(formats))}"
        )
    check_writable(path)


def save_figure(fig: Figure, path: Path) -> None:
    """Write the figure (format from the suffix) to a temp file, then rename it over `path`."""
    path = Path(path)
    check_output(path)
    suffix = path.suffix.lower().lstrip(".")
    tmp = path.with_name(f".{path.name}.tmp.{suffix}")
    with signals_deferred():
        try:
            fig.savefig(tmp, dpi=DPI)
            os.replace(tmp, path)
        except OSError as error:  # e.g. the disk filled up; `path` is left as it was
            raise ConfigError(f"cannot write {path}: {error.strerror or error}") from None
        finally:
            tmp.unlink(missing_ok=True)


__all__ = ["check_output", "plot_command", "save_figure"]
