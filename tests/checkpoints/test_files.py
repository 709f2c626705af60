"""Checkpoints: round trip, keep K, atomicity under SIGKILL and write errors, clear errors."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
import pytest
from orbax.checkpoint._src.path import atomicity

import podrace.checkpoints.files
import podrace.checkpoints.read
from podrace.checkpoints.files import Checkpointer, CheckpointWriteFailed
from podrace.checkpoints.manifest import MANIFEST, write_manifest
from podrace.checkpoints.read import read_config, restore
from podrace.checkpoints.state import RunState
from podrace.checkpoints.steps import checkpoint_steps, latest_step, step_lock
from podrace.config import ConfigError, TrainConfig, replace
from podrace.config_dict import config_from_dict
from podrace.envs import env_spec
from podrace.validation import validate
from tests.helpers.checkpoints import fresh_state, save_versions
from tests.helpers.cli import REPO, podrace_env, run_python
from tests.helpers.configs import tiny_config
from tests.waiting import wait_until


def assert_same_arrays(a: RunState, b: RunState) -> None:
    leaves_a, leaves_b = jax.tree.leaves(a.arrays()), jax.tree.leaves(b.arrays())
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.timeout(120)
def test_round_trip_restores_every_field_onto_the_template_sharding(tmp_path):
    cfg = tiny_config()
    states = save_versions(tmp_path, cfg, [4])
    like = fresh_state(cfg, seed=99)
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:2]), ("learner",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("learner"))
    like = dataclasses.replace(like, learner_keys=jax.device_put(like.learner_keys, sharding))

    restored = restore(tmp_path, like, env_spec(cfg.env))

    assert_same_arrays(restored, states[4])
    assert (restored.version, restored.env_steps, restored.episodes) == (
        4,
        4 * cfg.steps_per_update,
        12,
    )
    assert restored.actor_next_seq == states[4].actor_next_seq
    assert restored.learner_keys.sharding == sharding
    assert type(restored.train_state.opt_state) is type(states[4].train_state.opt_state)
    assert read_config(tmp_path) == (4, cfg)


@pytest.mark.timeout(120)
def test_keeps_the_last_k_and_skips_a_version_already_saved(tmp_path):
    cfg = tiny_config(**{"checkpoint.keep": 2})
    save_versions(tmp_path, cfg, [1, 2, 3, 3])
    (tmp_path / "\u00b2").mkdir()  # str.isdigit() says yes; int() says no
    (tmp_path / "\u0664\u0660").mkdir()  # Arabic-Indic 40: int() says 40
    assert checkpoint_steps(tmp_path) == [2, 3]
    assert latest_step(tmp_path) == 3
    restored = restore(tmp_path, fresh_state(cfg), env_spec(cfg.env), step=2)
    assert restored.version == 2


@pytest.mark.timeout(120)
def test_rotation_spares_a_step_a_reader_holds_until_it_is_released(tmp_path):
    """`podrace eval` of a live run holds the step it reads; keep 1 would delete it under it."""
    cfg = tiny_config(**{"checkpoint.keep": 1})
    checkpointer = Checkpointer(tmp_path, cfg, env_spec(cfg.env))
    try:
        checkpointer.save(fresh_state(cfg, seed=1, version=1))
        checkpointer.wait()
        with step_lock(tmp_path / "1", shared=True) as held:
            assert held
            for v in (2, 3):
                checkpointer.save(fresh_state(cfg, seed=v, version=v))
                checkpointer.wait()
                assert checkpoint_steps(tmp_path) == [1, v]  # 2 goes at 3's save, 1 is held
            restore(tmp_path, fresh_state(cfg), env_spec(cfg.env), step=1)
        checkpointer.save(fresh_state(cfg, seed=4, version=4))
        checkpointer.wait()
        assert checkpoint_steps(tmp_path) == [4]
    finally:
        checkpointer.close()
    with step_lock(tmp_path / "1", shared=True) as held:  # gone: nothing to hold
        assert not held


@pytest.mark.timeout(120)
def test_a_step_held_at_the_last_save_goes_at_close_once_released(tmp_path):
    cfg = tiny_config(**{"checkpoint.keep": 1})
    save_versions(tmp_path, cfg, [1])
    # held through the save of 2, released before the run ends: gone at close
    reader = os.open(tmp_path / "1", os.O_RDONLY)
    fcntl.flock(reader, fcntl.LOCK_SH)
    checkpointer = Checkpointer(tmp_path, cfg, env_spec(cfg.env))
    checkpointer.save(fresh_state(cfg, seed=2, version=2))
    checkpointer.wait()
    assert checkpoint_steps(tmp_path) == [1, 2]
    os.close(reader)
    checkpointer.close()
    assert checkpoint_steps(tmp_path) == [2]

    # still held when the run ends: kept (the end of a run does not wait for a reader), and
    # deleted by the next save (a resumed run's)
    with step_lock(tmp_path / "2", shared=True):
        start = time.monotonic()
        save_versions(tmp_path, cfg, [3])
        assert time.monotonic() - start < 30
    assert checkpoint_steps(tmp_path) == [2, 3]
    save_versions(tmp_path, cfg, [4])
    assert checkpoint_steps(tmp_path) == [4]


@pytest.mark.timeout(120)
def test_an_old_step_that_cannot_be_deleted_is_a_warning_not_a_failed_save(tmp_path, caplog):
    cfg = tiny_config(**{"checkpoint.keep": 1})
    save_versions(tmp_path, cfg, [1])
    (tmp_path / "1").rename(tmp_path / "elsewhere")
    (tmp_path / "1").symlink_to(tmp_path / "elsewhere")  # orbax will not rmtree a symlink
    save_versions(tmp_path, cfg, [2])
    assert latest_step(tmp_path) == 2
    assert f"could not delete old checkpoint {tmp_path / '1'}" in caplog.text


@pytest.mark.timeout(60)
def test_a_step_appears_only_with_its_manifest_and_one_without_is_refused(tmp_path, monkeypatch):
    """The manifest is written before the step is renamed into place, so a writer killed at
    any moment leaves no step that cannot be verified; a step without one was damaged."""
    cfg = tiny_config()
    listed_while_manifested, manifest = [], podrace.checkpoints.files.write_manifest

    def watched(step_dir):
        listed_while_manifested.append(checkpoint_steps(tmp_path))
        manifest(step_dir)

    monkeypatch.setattr(podrace.checkpoints.files, "write_manifest", watched)
    save_versions(tmp_path, cfg, [1, 2])
    assert listed_while_manifested == [[], [1]]
    (tmp_path / "2" / MANIFEST).unlink()
    with pytest.raises(
        ConfigError, match=rf"^corrupt checkpoint: {tmp_path / '2'} has no {MANIFEST}, so its files"
    ):
        restore(tmp_path, fresh_state(cfg), env_spec(cfg.env))
    assert restore(tmp_path, fresh_state(cfg), env_spec(cfg.env), step=1).version == 1


@pytest.mark.timeout(60)
def test_a_rotated_step_leaves_the_listing_before_its_files_are_deleted(tmp_path, monkeypatch):
    """A deletion killed halfway must not leave a damaged step that a resume would pick."""
    cfg = tiny_config(**{"checkpoint.keep": 1})
    deletions, rmtree = [], shutil.rmtree

    def watched(path, *args, **kwargs):
        deletions.append((Path(path).name, checkpoint_steps(tmp_path)))
        rmtree(path, *args, **kwargs)

    save_versions(tmp_path, cfg, [1])
    monkeypatch.setattr(podrace.checkpoints.files.shutil, "rmtree", watched)
    save_versions(tmp_path, cfg, [2])
    assert [listed for name, listed in deletions if name.startswith("1")] == [[2]]
    monkeypatch.undo()
    # left by a deletion, and by writes (this podrace's, an older one's), killed halfway:
    # the next writer clears them, and nothing else
    leftovers = [
        "1.deleting",
        "5.partial",
        "6.partial.orbax-checkpoint-tmp",
        "7.orbax-checkpoint-tmp-18",
    ]
    kept = [
        "3.partial-notes",
        "4.deleting_old",
        "8.partial.bak",
        "9.orbax-checkpoint-tmp-mine",
        "notes.partial",
    ]
    for name in leftovers + kept:
        (tmp_path / name / "d").mkdir(parents=True)
    save_versions(tmp_path, cfg, [3])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["3"] + kept)

    (tmp_path / "4.partial").write_text("not a directory podrace made")
    with pytest.raises(
        ConfigError, match=rf"^{tmp_path / '4.partial'} is in the way of podrace's checkpoints"
    ):
        Checkpointer(tmp_path, cfg, env_spec(cfg.env))
    assert (tmp_path / "4.partial").read_text() == "not a directory podrace made"


@pytest.mark.timeout(60)
def test_a_step_counts_as_saved_before_the_rotation_and_its_manifest_is_synced_before_it_appears(
    tmp_path, monkeypatch
):
    """A stop during a slow rotation must name the step just written as the latest; and
    a machine crash after the rename must not find an unsynced manifest."""
    cfg = tiny_config(**{"checkpoint.keep": 1})
    checkpointer = Checkpointer(tmp_path, cfg, env_spec(cfg.env))
    rotate, seen = checkpointer.rotate, []
    monkeypatch.setattr(
        checkpointer,
        "rotate",
        lambda: (seen.append(checkpointer.metrics.last("checkpoint/version")), rotate()),
    )
    synced, fsync = [], os.fsync
    monkeypatch.setattr(
        podrace.checkpoints.files.os,
        "fsync",
        lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), fsync(fd)),
    )
    try:
        for v in (1, 2):
            checkpointer.save(fresh_state(cfg, seed=v, version=v))
            checkpointer.wait()
    finally:
        checkpointer.close()
    assert seen[:2] == [1, 2]  # then once more at close
    step = str(tmp_path / "2")
    assert synced[-3:] == [f"{step}.partial/{MANIFEST}", f"{step}.partial", str(tmp_path)]


@pytest.mark.timeout(120)
def test_a_version_saved_by_an_earlier_run_is_never_replaced(tmp_path):
    cfg = tiny_config()
    save_versions(tmp_path, cfg, [1, 2])
    with pytest.raises(Exception, match="already exists"):
        save_versions(tmp_path, cfg, [2])  # e.g. a run resumed from 1 reaching 2 again
    assert_same_arrays(
        restore(tmp_path, fresh_state(cfg), env_spec(cfg.env)), fresh_state(cfg, seed=2, version=2)
    )


@pytest.mark.timeout(30)
def test_due_every_n_updates(tmp_path):
    def due_versions(every: int) -> list[int]:
        cfg = tiny_config(**{"checkpoint.every_updates": every})
        checkpointer = Checkpointer(tmp_path / str(every), cfg, env_spec(cfg.env))
        checkpointer.close()
        return [v for v in range(10) if checkpointer.due(v)]

    assert due_versions(3) == [3, 6, 9]
    assert due_versions(0) == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "changes,message",
    [
        ({"checkpoint.keep": 0}, "checkpoint.keep must be positive"),
        ({"checkpoint.every_updates": -1}, "checkpoint.every_updates must be >= 0"),
    ],
)
def test_checkpoint_settings_are_validated(changes, message):
    with pytest.raises(ConfigError, match=message):
        validate(replace(TrainConfig(), **changes))


@pytest.mark.timeout(30)
def test_config_round_trips_through_json_and_rejects_unknown_fields():
    cfg = tiny_config(**{"layout.actor_device_ids": (0, 1), "checkpoint.every_updates": 5})
    data = json.loads(json.dumps(dataclasses.asdict(cfg)))
    assert config_from_dict(data) == cfg
    data["ppo"]["no_such_field"] = 1
    with pytest.raises(ConfigError, match=r"config.ppo has unknown field\(s\): no_such_field"):
        config_from_dict(data)


# Atomicity ----------------------------------------------------------------------------

KILLED_WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from orbax.checkpoint._src.path import atomicity
    from podrace.checkpoints.files import Checkpointer
    from tests.helpers.checkpoints import fresh_state
    from tests.helpers.configs import tiny_config

    directory, marker = Path(sys.argv[1]), Path(sys.argv[2])
    cfg = tiny_config()
    checkpointer = Checkpointer(directory, cfg, __import__("podrace.envs").envs.env_spec(cfg.env))
    checkpointer.save(fresh_state(cfg, seed=1, version=1))
    checkpointer.wait()

    async def slow_finalize(self):  # every file written, not yet committed: worst moment
        marker.write_text("writing")
        time.sleep(600)

    for cls in (atomicity.AtomicRenameTemporaryPath, atomicity.CommitFileTemporaryPath):
        cls.finalize = slow_finalize
    checkpointer.save(fresh_state(cfg, seed=2, version=2))
    checkpointer.wait()
    """
)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigkill_during_a_write_leaves_the_previous_checkpoint_loadable(tmp_path):
    directory, marker = tmp_path / "checkpoints", tmp_path / "marker"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(directory), str(marker)],
        env=podrace_env(),
        cwd=REPO,
    )
    try:
        wait_until(
            marker.exists, 200, lambda: "writer never reached the slow write", while_alive=proc
        )
        written = [p for p in directory.iterdir() if p.name.startswith("2")]
        array_files = [q for p in written for q in p.rglob("d/*")]
        assert array_files, (
            "the kill must hit a write in progress (array data on disk, not committed)"
        )
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)

    cfg = tiny_config()
    assert latest_step(directory) == 1
    restored = restore(directory, fresh_state(cfg), env_spec(cfg.env))
    assert_same_arrays(restored, fresh_state(cfg, seed=1, version=1))

    # The next writer (a resumed run) saves version 2 and clears the leftover.
    save_versions(directory, cfg, [2])
    assert sorted(p.name for p in directory.iterdir()) == ["1", "2"]
    assert restore(directory, fresh_state(cfg), env_spec(cfg.env)).version == 2


@pytest.mark.timeout(120)
def test_a_failed_write_such_as_disk_full_surfaces_and_keeps_the_last_checkpoint(
    tmp_path, monkeypatch
):
    cfg = tiny_config()
    checkpointer = Checkpointer(tmp_path, cfg, env_spec(cfg.env))
    try:
        checkpointer.save(fresh_state(cfg, seed=1, version=1))
        checkpointer.wait()

        async def disk_full(self):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", disk_full)
        checkpointer.save(fresh_state(cfg, seed=2, version=2))
        with pytest.raises(
            CheckpointWriteFailed,
            match=f"^checkpoint 2 could not be written in {tmp_path}: .*No space left",
        ):
            checkpointer.wait()
    finally:
        checkpointer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "1"
    ]  # the space of the failed write is given back
    assert_same_arrays(
        restore(tmp_path, fresh_state(cfg), env_spec(cfg.env)), fresh_state(cfg, seed=1, version=1)
    )


STORAGE_REFUSES = textwrap.dedent(
    """
    import resource, signal, sys
    from pathlib import Path
    from podrace.checkpoints.files import Checkpointer
    from podrace.envs import env_spec
    from tests.helpers.checkpoints import fresh_state
    from tests.helpers.configs import tiny_config

    directory = Path(sys.argv[1])
    cfg = tiny_config(**{"network.hidden_sizes": (256,)})
    first, second = fresh_state(cfg, seed=1, version=1), fresh_state(cfg, seed=2, version=2)
    checkpointer = Checkpointer(directory, cfg, env_spec(cfg.env))
    checkpointer.save(first)
    checkpointer.wait()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    # every file over 4 KiB: "File too large"
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    checkpointer.save(second)
    try:
        checkpointer.wait()
    except Exception as error:
        print(f"{type(error).__name__}: {error}", flush=True)
    checkpointer.close()
    """
)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_write_the_storage_refuses_is_one_line_without_orbaxs_tracebacks(tmp_path):
    """A real refusal inside TensorStore (a file size limit; a full disk is the same path)
    is podrace's one-line error alone: no tracebacks with TensorStore's spec dump from
    orbax's threads, no "Event loop is closed" tracebacks from late callbacks."""
    proc = run_python("-W", "ignore", "-c", STORAGE_REFUSES, str(tmp_path), cwd=REPO, timeout=100)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"CheckpointWriteFailed: checkpoint 2 could not be written in {tmp_path}: "
    )
    assert "File too large" in lines[0] and "tensorstore_spec" not in lines[0]
    assert "Traceback" not in proc.stderr and "ERROR:absl" not in proc.stderr, proc.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1"]


class ReadOnly:
    """A directory made read-only for its writer, really: mode 0o555, or for root, whom modes
    do not stop, a read-only bind mount of the directory on itself."""

    def __init__(self, directory: Path):
        self.directory, self.mode, self.mounted = directory, None, False

    @staticmethod
    def skip_unless_possible(tmp_path: Path) -> None:
        """Skip the test where root may not mount (a container without the capability)."""
        if os.geteuid() != 0:
            return
        probe = ReadOnly(tmp_path / "read-only-probe")
        probe.directory.mkdir()
        try:
            probe.on()
        except subprocess.CalledProcessError as error:
            pytest.skip(f"root, and a read-only bind mount is not allowed here: {error.stderr}")
        probe.off()
        probe.directory.rmdir()

    def on(self) -> None:
        if self.mode is not None or self.mounted:
            return
        if os.geteuid() != 0:
            self.mode = self.directory.stat().st_mode
            self.directory.chmod(0o555)
            return
        where = str(self.directory)
        subprocess.run(["mount", "--bind", where, where], check=True, capture_output=True)
        self.mounted = True
        subprocess.run(["mount", "-o", "remount,bind,ro", where], check=True, capture_output=True)

    def off(self) -> None:
        if self.mode is not None:
            self.directory.chmod(self.mode)
            self.mode = None
        if self.mounted:
            subprocess.run(["umount", str(self.directory)], check=True, capture_output=True)
            self.mounted = False


@pytest.mark.timeout(120)
def test_a_checkpoints_folder_made_read_only_is_a_write_failure_not_a_deletion(tmp_path):
    """Made read-only between two saves: the next save creates nothing and says why, where
    it said the files had been deleted by another process."""
    ReadOnly.skip_unless_possible(tmp_path)
    cfg = tiny_config()
    directory = tmp_path / "checkpoints"
    checkpointer = Checkpointer(directory, cfg, env_spec(cfg.env))
    read_only = ReadOnly(directory)
    try:
        checkpointer.save(fresh_state(cfg, seed=1, version=1))
        checkpointer.wait()
        read_only.on()
        checkpointer.save(fresh_state(cfg, seed=2, version=2))
        with pytest.raises(CheckpointWriteFailed) as error:
            checkpointer.wait()
        assert re.fullmatch(
            f"checkpoint 2 could not be written in {re.escape(str(directory))}: "
            r"\[Errno (13|30)\] (Permission denied|Read-only file system).*",
            str(error.value),
        ), str(error.value)
        assert sorted(p.name for p in directory.iterdir()) == ["1"]
    finally:
        read_only.off()
        checkpointer.close()
    assert sorted(p.name for p in directory.iterdir()) == ["1"]


@pytest.mark.timeout(120)
def test_a_checkpoints_folder_made_read_only_during_a_write_names_what_it_could_not_remove(
    tmp_path, monkeypatch
):
    """Made read-only while a step is written: the unfinished step cannot be removed any more
    (nobody may delete in a read-only folder). The one-line error says so, it is never read
    as a checkpoint, and the next writer of the run, once it may write, removes it."""
    ReadOnly.skip_unless_possible(tmp_path)
    cfg = tiny_config()
    directory = tmp_path / "checkpoints"
    read_only = ReadOnly(directory)
    manifest = podrace.checkpoints.files.write_manifest

    def read_only_first(step_dir):
        read_only.on()
        manifest(step_dir)

    checkpointer = Checkpointer(directory, cfg, env_spec(cfg.env))
    try:
        checkpointer.save(fresh_state(cfg, seed=1, version=1))
        checkpointer.wait()
        monkeypatch.setattr(podrace.checkpoints.files, "write_manifest", read_only_first)
        checkpointer.save(fresh_state(cfg, seed=2, version=2))
        with pytest.raises(CheckpointWriteFailed) as error:
            checkpointer.wait()
        text = str(error.value)
        assert "\n" not in text and text.startswith(
            f"checkpoint 2 could not be written in {directory}: "
        ), text
        assert text.endswith(
            f"; {directory / '2.partial'} could not be removed (it is never read as a "
            "checkpoint; the run's next writer removes it)"
        ), text
    finally:
        read_only.off()
        checkpointer.close()
    assert checkpoint_steps(directory) == [1]
    monkeypatch.setattr(podrace.checkpoints.files, "write_manifest", manifest)
    save_versions(directory, cfg, [3])  # a resumed run, say
    assert sorted(p.name for p in directory.iterdir()) == ["1", "3"]


# Clear errors ---------------------------------------------------------------------------


def _largest_array_file(step_dir: Path) -> Path:
    return max(
        (p for p in (step_dir / "arrays").rglob("*") if p.is_file() and "/d/" in p.as_posix()),
        key=lambda p: p.stat().st_size,
    )


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x55
    path.write_bytes(bytes(data))


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "damage,message",
    [
        (_flip_byte, "SHA-256 mismatch"),
        (lambda p: os.truncate(p, 10), "has 10 bytes"),
        (os.remove, "is missing"),
    ],
)
def test_a_corrupt_checkpoint_names_the_file_and_what_is_wrong(tmp_path, damage, message):
    cfg = tiny_config()
    save_versions(tmp_path, cfg, [1])
    victim = _largest_array_file(tmp_path / "1")
    damage(victim)
    with pytest.raises(ConfigError) as error:
        restore(tmp_path, fresh_state(cfg), env_spec(cfg.env))
    text = str(error.value)
    assert str(victim) in text and message in text and "\n" not in text


@pytest.mark.timeout(120)
def test_damage_that_passes_the_manifest_is_still_reported_with_the_file(tmp_path):
    cfg = tiny_config()
    save_versions(tmp_path, cfg, [1])
    (tmp_path / "1" / "meta" / "metadata").write_text('{"format": 1, "conf')
    write_manifest(tmp_path / "1")
    with pytest.raises(ConfigError, match=r"corrupt checkpoint: .*1/meta"):
        restore(tmp_path, fresh_state(cfg), env_spec(cfg.env))


@pytest.mark.timeout(120)
def test_a_checkpoint_of_another_network_or_env_does_not_load(tmp_path):
    cfg = tiny_config()
    save_versions(tmp_path, cfg, [1])
    wider = tiny_config(**{"network.hidden_sizes": (16,)})
    with pytest.raises(
        ConfigError,
        match=r"does not fit this config: train_state.params.params.policy_head.kernel is "
        r"float32\[8, 2\] in the checkpoint, float32\[16, 2\] under this config \(and 7 more",
    ):
        restore(tmp_path, fresh_state(wider), env_spec(wider.env))
    more_actors = tiny_config(**{"layout.actors_per_device": 3})
    with pytest.raises(
        ConfigError,
        match=r"actor_keys is uint32\[2, 2\] in the checkpoint, uint32\[3, 2\] under this config "
        r"\(and 1 more",
    ):
        restore(tmp_path, fresh_state(more_actors), env_spec(more_actors.env))
    other_env = env_spec(dataclasses.replace(cfg.env, id="Pendulum-v1"))
    with pytest.raises(
        ConfigError,
        match=r"saved for env 'CartPole-v1' with obs_shape \[4\], the config's env has \[3\]",
    ):
        restore(tmp_path, fresh_state(cfg), other_env)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_run_that_fed_discrete_observations_as_numbers_is_refused_with_the_reason(tmp_path):
    """Discrete observations are one-hot vectors: a checkpoint of a run that fed them as
    numbers is refused, with the reason."""
    cfg = tiny_config(**{"env.id": "FrozenLake-v1"})
    current = env_spec(cfg.env)
    before = current._replace(obs_shape=(), obs_dtype=np.dtype(np.int64))
    checkpointer = Checkpointer(tmp_path, cfg, before)
    try:
        checkpointer.save(fresh_state(cfg, version=1))
    finally:
        checkpointer.close()
    with pytest.raises(
        ConfigError,
        match=r"with obs_shape \[\], the config's env has \[16\] \(Discrete observations "
        r"are one-hot since podrace 2026-12-06; this run predates it\)$",
    ):
        restore(tmp_path, fresh_state(cfg), current)


@pytest.mark.timeout(60)
def test_no_checkpoint_or_unknown_step_is_a_config_error(tmp_path):
    cfg = tiny_config()
    with pytest.raises(ConfigError, match=f"no checkpoint in {tmp_path}"):
        restore(tmp_path, fresh_state(cfg), env_spec(cfg.env))
    (tmp_path / "7.orbax-checkpoint-tmp-123").mkdir()  # a killed write is not a checkpoint
    with pytest.raises(ConfigError, match="no checkpoint in"):
        restore(tmp_path, fresh_state(cfg), env_spec(cfg.env))
    save_versions(tmp_path, cfg, [1, 2])
    with pytest.raises(ConfigError, match=r"no checkpoint for step 5 .*\(saved: 1, 2\)"):
        restore(tmp_path, fresh_state(cfg), env_spec(cfg.env), step=5)


def _manifest(text: bytes) -> Callable[[Path], None]:
    return lambda step_dir: (step_dir / MANIFEST).write_bytes(text)


def _meta(edit: Callable[[dict], object]) -> Callable[[Path], None]:
    """Edit the meta JSON of a checkpoint and its manifest to match: meta that passes the
    manifest (written so by another program, or by a podrace that wrote it wrong)."""

    def damage(step_dir: Path) -> None:
        path = step_dir / "meta" / "metadata"
        meta = json.loads(path.read_text())
        edit(meta)
        path.write_text(json.dumps(meta))
        write_manifest(step_dir)

    return damage


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "damage,message",
    [
        (
            _manifest(b'{"files": [1, 2]}'),
            "is not a valid manifest ('files' must map file names to sizes and hashes, got list)",
        ),
        (
            _manifest(b'{"files": {"meta/metadata": {}}}'),
            "is not a valid manifest (entry 'meta/metadata' must be a file",
        ),
        (
            _manifest(b'{"files": {"../../x": {"bytes": 1, "sha256": "' + b"0" * 64 + b'"}}}'),
            "entry '../../x' must be a file",
        ),
        (_manifest(b"[3]"), "is not a valid manifest ('files' must map"),
        (
            _manifest(b"[" * 100_000 + b"]" * 100_000),
            "is not a valid manifest (nested too deeply to decode",
        ),
        (_manifest(b'{"files": "\xff"}'), "is not a valid manifest ("),
        (
            _manifest(b'{"format": 99, "files": {}}'),
            "is not a valid manifest (format 99, this podrace writes 1)",
        ),
        (
            _manifest(b'{"format": 1, "files": {}}'),
            "is not in the manifest (added after the checkpoint was written)",
        ),
        (
            _meta(lambda m: [m.pop(k) for k in list(m) if k != "format"]),
            "meta: 'config' is missing",
        ),
        (_meta(lambda m: m.pop("actor_next_seq")), "meta: 'actor_next_seq' is missing"),
        (
            _meta(lambda m: m.update(actor_next_seq=[0])),
            "meta: 'actor_next_seq' has 1 entries for 2 actors",
        ),
        (
            _meta(lambda m: m.update(actor_next_seq=[0, "x"])),
            "meta: 'actor_next_seq' must be a list of non-negative integers",
        ),
        (
            _meta(lambda m: m.update(version="3")),
            "meta: 'version' must be a non-negative integer, got \"3\"",
        ),
        (_meta(lambda m: m.update(env_spec=None)), "meta: 'env_spec' must be a mapping, got null"),
        (_meta(lambda m: m.update(time_s="soon")), "meta: 'time_s' must be a non-negative number"),
        (
            _meta(lambda m: m.update(counters=[{"episodes": -1}])),
            "meta: 'counters' must be a list of {name: non-negative number}, one per process",
        ),
        (
            _meta(lambda m: m.update(counters=[])),
            "meta: 'counters' must be a list of {name: non-negative number}, one per process",
        ),
        (
            _meta(lambda m: m.update(env_factory={"name": "f", "import": "os:system; rm"})),
            'meta: \'env_factory\' must be {"name": str, "import": "module:qualname" or null}',
        ),
        (
            _meta(lambda m: m["config"]["env"].update(num_envs="lots")),
            'env.num_envs must be int, got "lots"',
        ),
        (
            _meta(lambda m: m["config"]["network"].update(hidden_sizes=[8, "x"])),
            "network.hidden_sizes must be tuple[int, ...]",
        ),
        (_meta(lambda m: m["config"].update(env=3)), ".env must be a mapping, got int"),
        (
            _meta(lambda m: m["config"]["env"].update(num_envs=-4)),
            "env.num_envs must be positive, got -4",
        ),
    ],
    ids=[
        "files-list",
        "entry-empty",
        "entry-outside",
        "not-object",
        "too-deep",
        "not-utf8",
        "other-format",
        "files-unlisted",
        "meta-format-only",
        "no-actor-seq",
        "actor-seq-short",
        "actor-seq-type",
        "version-type",
        "env-spec-type",
        "time-type",
        "counters-negative",
        "counters-empty",
        "env-factory-shape",
        "num-envs-type",
        "hidden-sizes-type",
        "env-section-type",
        "num-envs-negative",
    ],
)
def test_a_manifest_or_meta_of_the_wrong_shape_is_a_corrupt_checkpoint(tmp_path, damage, message):
    cfg = tiny_config()
    save_versions(tmp_path, cfg, [1])
    damage(tmp_path / "1")
    with pytest.raises(ConfigError) as error:
        restore(tmp_path, fresh_state(cfg), env_spec(cfg.env))
    text = str(error.value)
    assert text.startswith(f"corrupt checkpoint: {tmp_path / '1'}") or text.startswith(
        f"corrupt checkpoint: config of checkpoint {tmp_path / '1'}"
    ), text
    assert message in text and "\n" not in text, text


@pytest.mark.timeout(120)
def test_every_counter_round_trips_and_an_older_checkpoint_gives_the_three_it_kept(tmp_path):
    cfg = tiny_config()
    counters = {"env_steps": 64.0, "episodes": 6.0, "ray/restarts": 2.0}
    state = dataclasses.replace(fresh_state(cfg, version=2), counters=counters)
    checkpointer = Checkpointer(tmp_path, cfg, env_spec(cfg.env))
    try:
        checkpointer.save(state)
    finally:
        checkpointer.close()
    assert restore(tmp_path, fresh_state(cfg), env_spec(cfg.env)).counters == counters
    _meta(lambda m: m.pop("counters"))(tmp_path / "2")  # as podrace before counters wrote it
    assert restore(tmp_path, fresh_state(cfg), env_spec(cfg.env)).counters == {
        "env_steps": float(state.env_steps),
        "episodes": 6.0,
        "learner/skipped_nonfinite": 0.0,
    }


@pytest.mark.timeout(120)
def test_a_step_folder_renamed_to_another_step_is_a_corrupt_checkpoint(tmp_path):
    """The folder's name is the step a resume continues from and a resume's later writes
    are named by: a folder whose meta holds another update is refused, not loaded as it."""
    cfg = tiny_config()
    save_versions(tmp_path, cfg, [1])
    os.rename(tmp_path / "1", tmp_path / "5")
    message = re.escape(
        f"corrupt checkpoint: {tmp_path / '5' / 'meta'}: it holds update 1, "
        "but its folder is named 5 (a step folder must keep the name it was written with)"
    )
    with pytest.raises(ConfigError, match=f"^{message}$"):
        read_config(tmp_path, 5)
    with pytest.raises(ConfigError, match=f"^{message}$"):
        restore(tmp_path, fresh_state(cfg), env_spec(cfg.env))


@pytest.mark.timeout(120)
def test_a_damaged_chunk_that_passes_the_manifest_leaves_no_read_running_behind(
    tmp_path, monkeypatch
):
    """orbax's event loop is closed when the first read fails; the reads still in flight then
    called back into it ("RuntimeError: Event loop is closed" tracebacks after the error)."""
    cfg = tiny_config()
    save_versions(tmp_path, cfg, [1])
    index = max(
        (tmp_path / "1" / "arrays" / "d").iterdir(), key=lambda p: p.stat().st_size
    )  # ocdbt's b-tree
    _flip_byte(index)
    write_manifest(tmp_path / "1")
    stray = []
    monkeypatch.setattr(sys, "unraisablehook", stray.append)
    with pytest.raises(
        ConfigError, match=rf"^corrupt checkpoint: {index}: .*checksum verification failed"
    ):
        restore(tmp_path, fresh_state(cfg), env_spec(cfg.env))
    # Nothing marks the late callbacks' turn having passed: they came within milliseconds,
    # so this waits well beyond. A loaded machine can only make it pass vacuously.
    for _ in range(20):
        if stray:
            break
        time.sleep(0.1)
    assert [f"{u.exc_type.__name__}: {u.exc_value}" for u in stray] == []
    assert checkpoint_steps(tmp_path) == [1]


@pytest.mark.timeout(120)
def test_a_checkpoints_folder_deleted_under_the_run_is_named_not_a_100_line_orbax_error(
    tmp_path, monkeypatch
):
    """`rm -rf checkpoints` of a live run during a write fails it with an error naming what
    happened (the CLI prints it in one line), not orbax's TensorStore spec dump and a
    traceback. Deleted between two saves, the folder is simply made again."""
    cfg = tiny_config()
    directory = tmp_path / "checkpoints"
    checkpointer = Checkpointer(directory, cfg, env_spec(cfg.env))
    try:
        checkpointer.save(fresh_state(cfg, version=1))
        checkpointer.wait()
        shutil.rmtree(directory)
        checkpointer.save(fresh_state(cfg, version=2))
        checkpointer.wait()
        assert checkpoint_steps(directory) == [2]

        manifest = podrace.checkpoints.files.write_manifest

        def deleted_first(step_dir):
            shutil.rmtree(directory)
            manifest(step_dir)

        monkeypatch.setattr(podrace.checkpoints.files, "write_manifest", deleted_first)
        checkpointer.save(fresh_state(cfg, version=3))
        with pytest.raises(
            podrace.checkpoints.files.CheckpointFilesRemoved, match=f"checkpoint 3 in {directory}"
        ):
            checkpointer.wait()
    finally:
        with contextlib.suppress(Exception):
            checkpointer.close()

    from podrace.commands.train import explains_itself

    assert explains_itself(podrace.checkpoints.files.CheckpointFilesRemoved("x"))
