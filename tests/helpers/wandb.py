"""A stand-in for the `wandb` module that records what a run sends it."""

from __future__ import annotations

import sys
import types

import pytest


class FakeRun:
    """A W&B run: keeps its init arguments, its metric definitions and every logged dict."""

    def __init__(self, **init):
        self.init, self.logged, self.step_metrics, self.finished = init, [], [], False

    def define_metric(self, name, step_metric):
        self.step_metrics.append((name, step_metric))

    def log(self, values):
        self.logged.append(values)

    def finish(self):
        self.finished = True


def install_fake_wandb(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """Puts a fake `wandb` in sys.modules for the test; its `runs` lists every FakeRun that
    `wandb.init` made."""
    module = types.ModuleType("wandb")
    module.runs = []

    def init(**kwargs):
        module.runs.append(FakeRun(**kwargs))
        return module.runs[-1]

    module.init = init
    monkeypatch.setitem(sys.modules, "wandb", module)
    return module
