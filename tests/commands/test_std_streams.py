"""A command's result line (podrace.commands.std_streams.print_result)."""

from __future__ import annotations

import io
import os
import sys

import pytest

from podrace.commands.std_streams import flush_std_streams, print_result


@pytest.mark.timeout(30)
def test_a_result_reaches_stdout_with_exit_0(capsys):
    assert print_result("done: 1 update") == 0
    assert capsys.readouterr() == ("done: 1 update\n", "")


def broken_pipe() -> io.TextIOWrapper:
    read, write = os.pipe()
    os.close(read)  # the reader has gone (`| head -0`); Python ignores SIGPIPE
    return open(write, "w")


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "stdout, reason",
    [
        (lambda: open("/dev/full", "w"), "No space left on device"),
        (broken_pipe, "Broken pipe"),
    ],
)
def test_stdout_that_refuses_the_result_is_one_line_and_exit_1(monkeypatch, capsys, stdout, reason):
    """`podrace train ... >/dev/full` (or into a closed pipe): after the run succeeded and
    saved, the refused result is one line and exit 1, not a traceback."""
    refusing = stdout()
    monkeypatch.setattr(sys, "stdout", refusing)
    try:
        assert print_result("done: 1 update") == 1
    finally:
        monkeypatch.undo()
        try:
            refusing.close()
        except OSError:  # its buffer still cannot be written
            pass
    assert capsys.readouterr().err.splitlines() == [
        f"podrace: error: could not write to stdout ({reason}); the command itself succeeded"
    ]


@pytest.mark.timeout(30)
def test_a_process_started_with_stdout_closed_has_nothing_to_print(monkeypatch):
    monkeypatch.setattr(sys, "stdout", None)
    assert print_result("done: 1 update") == 0


@pytest.mark.timeout(30)
def test_the_exits_flush_takes_a_missing_or_refusing_stdout(monkeypatch):
    """A process started with stdout closed has sys.stdout None unless the command guarded it
    (`podrace.cli.main(argv)` from Python, then a signal's exit): the exit's flush takes
    that, with no AttributeError to turn a success into exit 1."""
    monkeypatch.setattr(sys, "stdout", None)
    flush_std_streams()
    full = open("/dev/full", "w")
    full.write("x")  # buffered: the flush is what the disk refuses
    monkeypatch.setattr(sys, "stdout", full)
    flush_std_streams()
    monkeypatch.undo()
    try:
        full.close()
    except OSError:
        pass
