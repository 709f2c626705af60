"""Signals and the main thread of the commands.

`podrace train` runs in a worker thread while the main thread only watches, so that
signals are always seen and a run that will not stop still ends (`supervise`). `podrace
eval` and `podrace plot` write their outputs only at their end, so a signal simply ends
them at once (`exit_at_once_on_signals`), unless an output is being written.

The supervised object (`podrace.commands.train.Training`) is called in the worker thread and
exposes what the watch needs: `outcome` (the exit code or exception, once done),
`lifetime` (the run's Lifetime once JAX is imported, else None), `run` (the prepared run
or None), `topology` (once chosen, else None), `grace_s`, `starved_exit_s`, `distributed`,
`discard_untrained_run_dir()` for a process that exits before its run trained,
`leave_cluster()`, which leaves the run's other processes at once, and
`stopped(left_behind)`, which writes the line of a run stopped by a signal.

A library caller's run gets the same clean stop on Ctrl-C from
`podrace.runtime.interrupts`.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from podrace.commands.std_streams import flush_std_streams
from podrace.runtime.stderr import write_stderr_now

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals that stop a command (exit code 128 + the signal)."""
EXIT_GRACE_S = 1.5
"""After a signal, seconds the run gets to stop and write its last line before the process
exits regardless (a thread stuck in native code, a long compile), until the run's topology
says how long it needs (`Cluster.exit_grace_s`)."""
LAST_SAVE_S = 60.0
"""After the exit grace, seconds more a run that stopped and is saving its last checkpoint
gets to finish it (`Run.saving_last`; a second signal still exits at once)."""
STARVED_EXIT_S = 120.0
"""Seconds the main thread may go without running Python before the process is ended
(exit 1, every thread's stack on stderr; at least twice the run's watchdog timeout). Only a
native call that holds the GIL and never returns (an env extension that does not release
it) does that, and it starves the watchdog and the signal handlers, which are Python too;
faulthandler's timer is a C thread that needs no GIL."""


class Signals:
    """SIGINT and SIGTERM stop the run cleanly; the exit code is 128 + the signal.

    The handler only records the signal: raising inside whatever frame the main thread is
    in (a callback from C++, a lock) can abort the process or be lost. The main thread only
    supervises and acts on it. A second signal while stopping exits at once.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self.before_exit: Callable[[], None] | None = None
        """Called by a second signal before the process exits (undo what a half-built run
        left: it will never run)."""
        self.last_words: Callable[[], str] | None = None
        """What a second signal's line adds (which checkpoint the run leaves)."""
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum, frame) -> None:  # noqa: ARG002 - signal handler signature
        if self.received is not None:
            words = self.last_words() if self.last_words is not None else ""
            _exit_on_a_second(signum, self.before_exit, words)
        self.received = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else ""


def _exit_on_a_second(
    signum: int, before_exit: Callable[[], None] | None = None, words: str = ""
) -> None:
    """A second signal while stopping: one line (ending with `words`), then exit at once."""
    write_stderr_now(f"podrace: second {signal.Signals(signum).name}, exiting now{words}\n")
    if before_exit is not None:
        before_exit()
    os._exit(128 + signum)


def exit_now(code: int) -> None:
    """Leave without waiting for threads stuck in native code (no atexit, no finalizers:
    a daemon thread inside C++ at interpreter shutdown can abort the process)."""
    flush_std_streams()
    os._exit(code)


def leave(code: int) -> None:
    """End a command's process: the atexit handlers run (Ray's and logging's shutdown,
    weakref finalizers, temporary folders), interpreter finalization does not. It took
    0.6 s of a 6.5 s `podrace train` tearing JAX down, and it kills a thread still in
    native code (an env stuck in C, a learner in a collective), which a C++ `catch (...)`
    turns into an abort (exit 134) after the command succeeded. Every file podrace writes
    is closed before its command returns."""
    flush_std_streams()
    atexit._run_exitfuncs()
    exit_now(code)


def supervise(training, signals: Signals) -> int:
    """Run `training` in a worker thread until it ends; its exit code (its exception is
    raised here). Acts on `signals` meanwhile and ends a process whose main thread starves."""
    worker = threading.Thread(target=training, name="podrace-train", daemon=True)
    worker.start()
    deadline, armed = None, 0.0
    try:
        while worker.is_alive():
            if time.monotonic() - armed > 1.0:  # re-armed while this thread runs Python
                faulthandler.dump_traceback_later(training.starved_exit_s, exit=True, file=2)
                armed = time.monotonic()
            worker.join(0.05)
            if signals.received:
                deadline = _act_on_signals(training, signals, worker, deadline)
    finally:
        faulthandler.cancel_dump_traceback_later()
    outcome = training.outcome[0]
    # A process of a jax.distributed group that met its cluster never leaves through the
    # interpreter; one whose config was refused before that returns like any other.
    in_group = training.distributed and training.topology is not None
    if isinstance(outcome, BaseException) and in_group:
        # Never into the interpreter's exit: JAX's shutdown barrier there waits for peers
        # that may be gone (up to 10 minutes).
        traceback.print_exception(outcome, file=sys.stderr)
        training.leave_cluster()
        exit_now(1)
    if isinstance(outcome, BaseException):
        raise outcome
    if in_group:
        training.leave_cluster()  # the run left already, unless it never joined
        # Never wait at exit for a lost peer (atexit) or for threads left in a collective.
        exit_now(outcome)
    if training.run is not None and training.run.stuck:
        print(
            f"podrace: threads stuck in native code left behind: {', '.join(training.run.stuck)}",
            file=sys.stderr,
        )
        exit_now(outcome)
    return outcome


class _ExitDeadline:
    """When a stopping run's process exits regardless: `grace_s` after the signal; while the
    run saves its last checkpoint, up to LAST_SAVE_S later, and then `grace_s` after the
    save for the rest of the stop (joining threads, closing envs, the last line)."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.at = time.monotonic() + grace_s
        self.last_save_until = self.at + LAST_SAVE_S

    def passed(self, run) -> bool:
        now = time.monotonic()
        if run is not None and run.saving_last and now < self.last_save_until:
            self.at = max(self.at, now + self.grace_s)
            return False
        return now > self.at


def _act_on_signals(
    training, signals: Signals, worker: threading.Thread, deadline: _ExitDeadline | None
) -> _ExitDeadline:
    """Stop the run on the first signal; exit once its grace period is over. Returns the
    exit deadline."""
    if deadline is None:
        if training.lifetime is None:  # still parsing and validating: nothing written yet
            exit_now(training.stopped())
        deadline = _ExitDeadline(training.grace_s)
        training.lifetime.stop(f"{signals.name} received")
    if worker.is_alive() and deadline.passed(training.run):
        # e.g. still compiling: leave no config-only run behind
        training.discard_untrained_run_dir()
        if training.distributed:  # the others were told to stop a grace period ago
            training.leave_cluster()
        exit_now(training.stopped(left_behind=True))
    return deadline


class _ExitAtOnce:
    """SIGINT/SIGTERM handling of a command that writes its outputs only at its end
    (`podrace eval`, `podrace plot`): the process exits at once with one line and 128 + the
    signal, or right after the output being written (see `signals_deferred`). A
    KeyboardInterrupt raised instead is lost or becomes a traceback when it lands inside
    one of JAX's callbacks or imports."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.writing = 0

    def handle(self, signum, frame) -> None:  # noqa: ARG002 - signal handler signature
        if self.received is not None:  # at once, even mid-write, as in train
            _exit_on_a_second(signum)
        self.received = signum
        if not self.writing:
            self.exit()

    def exit(self) -> None:
        write_stderr_now(f"podrace: {signal.Signals(self.received).name} received, stopped\n")
        exit_now(128 + self.received)


_exit_at_once: _ExitAtOnce | None = None


def end_at_once_on_signals() -> None:
    """For the process's own command line, from its first moment: a signal ends the process
    at once with one line, until a command installs its own handling (nothing is written
    before a command runs)."""
    handler = _ExitAtOnce()
    for signum in STOP_SIGNALS:
        signal.signal(signum, handler.handle)


def ignore_signals_from_now_on() -> None:
    """Once a command's work is done and its exit code known: SIGINT and SIGTERM while the
    interpreter shuts down are ignored, so the process ends with that code. Python removes
    its own handlers early in shutdown, and JAX's teardown then takes about half a second,
    in which a signal would be a silent kill (or a KeyboardInterrupt in an atexit callback);
    only an ignored signal stays ignored."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


@contextmanager
def exit_at_once_on_signals() -> Iterator[None]:
    """While a command that writes only at its end runs, a signal ends the process at once."""
    global _exit_at_once
    _exit_at_once = handler = _ExitAtOnce()
    previous = {signum: signal.signal(signum, handler.handle) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
        _exit_at_once = None


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Around writing an output (a temp file, then a rename): a signal that would end the
    process at once waits until the write is done or failed, so no temp file is left."""
    handler = _exit_at_once
    if handler is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    handler.writing += 1
    try:
        yield
    finally:
        handler.writing -= 1
        if not handler.writing and handler.received:
            handler.exit()
