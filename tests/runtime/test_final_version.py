"""The last save of a stopped multi-host run: which version every process writes."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from podrace.checkpoints.files import Writers
from podrace.checkpoints.saving import RunCheckpoints
from podrace.config import TrainConfig
from podrace.control import Lifetime
from podrace.metrics.registry import Metrics
from podrace.runtime.multihost.distributed import Cluster
from podrace.runtime.multihost.group import DistributedGroup

pytestmark = pytest.mark.timeout(60)


class Store:
    """jax.distributed's key-value store, in memory, shared by threads playing processes."""

    def __init__(self) -> None:
        self._values: dict[str, str] = {}
        self._changed = threading.Condition()

    def key_value_set(self, key: str, value: str) -> None:
        with self._changed:
            self._values[key] = value
            self._changed.notify_all()

    def blocking_key_value_get(self, key: str, timeout_ms: int) -> str:
        with self._changed:
            if not self._changed.wait_for(lambda: key in self._values, timeout_ms / 1000):
                raise TimeoutError(key)
            return self._values[key]


class SavedVersions:
    """The Checkpointer's part of a save: which versions were handed to it."""

    def __init__(self) -> None:
        self.versions: list[int] = []

    def due(self, version: int) -> bool:
        return False  # no periodic save: only the last one

    def save(self, state) -> None:
        self.versions.append(state.version)


def last_save(process: int, recorded: list[int], store: Store, saved: dict) -> None:
    """Process `process` recorded the states of `recorded` (in order), then stopped: its
    part of the last save, as `Run._save_final` does it."""
    group = DistributedGroup()
    group.cluster = Cluster(process, 2, "127.0.0.1:9", store, 10.0)
    group.shared, group.peer_timeout_s = True, 10.0
    group.lifetime = lifetime = Lifetime()
    writers = Writers(process, 2)
    checkpoints = RunCheckpoints(
        TrainConfig(), None, "/nonexistent", Metrics(), SimpleNamespace(version=0), writers
    )
    checkpoints._checkpointer = written = SavedVersions()
    for version in recorded:
        checkpoints.record(SimpleNamespace(version=version), lifetime)
    version = group.last_save_version(checkpoints.point.version, True, checkpoints.abandon)
    if version is not None:
        checkpoints.save_final(lifetime, version)
    saved[process] = written.versions


@pytest.mark.parametrize("ahead", [0, 1])
def test_processes_stopped_one_update_apart_all_save_the_version_every_one_recorded(ahead):
    """The update is collective, so one process may have recorded update 7 while the other
    stopped before recording it: both save 6, which each holds."""
    store, saved = Store(), {}
    recorded = {ahead: [5, 6, 7], 1 - ahead: [5, 6]}
    threads = [
        threading.Thread(target=last_save, args=(p, recorded[p], store, saved)) for p in (0, 1)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert saved == {0: [6], 1: [6]}
