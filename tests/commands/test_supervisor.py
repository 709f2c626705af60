"""The main thread of `podrace train` (`podrace.commands.supervisor.supervise`) with a fake
run: when a stopping run's process exits on its own, and the one line it writes."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from podrace.commands import supervisor
from podrace.commands.train import Training


class ExitedNow(Exception):
    pass


class FakeRun:
    saving_last = False
    stuck: list[str] = []


class FakeLifetime:
    def __init__(self) -> None:
        self.stopped = threading.Event()

    def stop(self, reason: str) -> None:
        self.stopped.set()


class SlowLastSave:
    """A training whose stop saves for longer than the grace, then takes `rest_s` more to
    join its threads and close its envs before it writes its line."""

    def __init__(self, signals: supervisor.Signals, save_s: float, rest_s: float) -> None:
        self.signals, self.save_s, self.rest_s = signals, save_s, rest_s
        self.grace_s, self.starved_exit_s = 1.0, 60.0
        self.lifetime, self.run = FakeLifetime(), FakeRun()
        self.distributed = False
        self.outcome: list = []
        self.lines: list[bool] = []

    def __call__(self) -> None:
        self.lifetime.stopped.wait(10)
        self.run.saving_last = True
        time.sleep(self.save_s)
        self.run.saving_last = False
        time.sleep(self.rest_s)
        self.outcome.append(self.stopped())

    def stopped(self, left_behind: bool = False) -> int:
        self.lines.append(left_behind)
        return 128 + self.signals.received

    def discard_untrained_run_dir(self) -> None:
        pass

    def shutdown(self, ok: bool) -> None:
        pass


@pytest.fixture
def exits(monkeypatch):
    def exit_now(code):
        raise ExitedNow(code)

    monkeypatch.setattr(supervisor, "exit_now", exit_now)


@pytest.mark.timeout(30)
def test_a_run_that_finishes_its_stop_soon_after_a_long_last_save_is_not_left_behind(exits):
    """The last save outlasts the grace; the rest of the stop then gets a grace of its own,
    so the run's thread writes the line (stopped cleanly), not the main thread."""
    signals = supervisor.Signals()
    signals.received = signal.SIGTERM
    training = SlowLastSave(signals, save_s=1.5, rest_s=0.2)
    assert supervisor.supervise(training, signals) == 128 + signal.SIGTERM
    assert training.lines == [False]


@pytest.mark.timeout(30)
def test_a_run_still_stopping_a_grace_after_its_last_save_is_left_behind(exits):
    """Then the process exits without waiting for the run's thread, saying it left it."""
    signals = supervisor.Signals()
    signals.received = signal.SIGTERM
    training = SlowLastSave(signals, save_s=0.5, rest_s=3.0)
    with pytest.raises(ExitedNow) as exited:
        supervisor.supervise(training, signals)
    assert exited.value.args == (128 + signal.SIGTERM,)
    assert training.lines == [True]


def test_the_stopped_line_is_written_once(capsys):
    signals = supervisor.Signals()
    signals.received = signal.SIGINT
    training = Training([], signals)
    assert training.stopped() == training.stopped(left_behind=True) == 128 + signal.SIGINT
    assert capsys.readouterr().err == "podrace: SIGINT received, stopped cleanly\n"
