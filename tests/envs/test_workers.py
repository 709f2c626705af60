"""Env worker processes: they step exactly the envs an actor thread would, report errors and
deaths in one line naming themselves, ignore Ctrl-C, and never outlive their parent."""

from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys
import textwrap
import threading

import gymnasium
import numpy as np
import pytest

from podrace.config import ConfigError, EnvConfig
from podrace.envs import EnvSource
from podrace.envs.sending import check_sendable
from podrace.envs.worker_protocol import RESET, STEP, StepBuffers, shared_fd
from podrace.envs.workers import (
    EnvWorker,
    EnvWorkerDied,
    EnvWorkerError,
    split_envs,
)
from tests.envs.worker_steps import assert_workers_step_as_one
from tests.inference import fake_envs
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("backend", ["gymnasium", pytest.param("envpool", marks=pytest.mark.slow)])
def test_workers_step_the_envs_the_actor_thread_would(backend):
    """The parts of an actor's envs, each seeded as in the whole, step the same episodes."""
    source = EnvSource(EnvConfig(id="CartPole-v1", backend=backend, max_episode_steps=20))
    spec = source.spec()
    assert spec.num_actions == 2
    assert_workers_step_as_one(source, spec, 6, 123, workers=3, steps=60, action_dtype=np.int32)


def test_split_envs_needs_equal_parts():
    assert split_envs(6, 3) == [range(0, 2), range(2, 4), range(4, 6)]
    with pytest.raises(ConfigError, match="multiple of env.workers"):
        split_envs(6, 4)


def test_step_buffers_are_views_of_the_shared_memory_both_sides_map():
    """A step is written into the shared memory and read from it, never copied: the
    actions and every field of `step` are distinct views of the one mapping, and what one
    side's map writes (a step, a reset) the other side's map reads."""
    spec, n = fake_envs.SPEC, 3
    size = StepBuffers.size(spec, n)
    fd = shared_fd(size)
    try:
        writer_map, reader_map = mmap.mmap(fd, size), mmap.mmap(fd, size)
        writer, reader = StepBuffers(writer_map, spec, n), StepBuffers(reader_map, spec, n)
        views = [writer.actions, *writer.step]
        shared = np.frombuffer(writer_map, np.uint8)
        assert all(np.shares_memory(view, shared) for view in views)
        assert not any(np.shares_memory(a, b) for i, a in enumerate(views) for b in views[i + 1 :])
        step = type(writer.step)(
            *((np.arange(v.size) + 1).reshape(v.shape).astype(v.dtype) for v in writer.step)
        )
        writer.write(step)
        for got, want in zip(reader.step, step, strict=True):
            np.testing.assert_array_equal(got, want)
        writer.write_reset(np.full_like(step.obs, 5))
        assert (reader.step.obs == 5).all() and not any(v.any() for v in reader.step[1:])
    finally:
        os.close(fd)


def worker(factory=None, name="w0") -> EnvWorker:
    source = EnvSource(EnvConfig(), factory=factory or fake_envs.CheckedEnvs())
    w = EnvWorker(name, source, fake_envs.SPEC, 4, 7, range(0, 2))
    w.start()
    return w


def test_a_killed_worker_is_reported_in_one_line_with_its_signal():
    w = worker()
    try:
        w.wait_started()
        w.send(RESET)
        w.read_reply()
        w.kill()
        w.buffers.actions[...] = fake_envs.expected_action(w.buffers.step.obs)
        w.send(STEP)
        with pytest.raises(EnvWorkerDied) as raised:
            w.read_reply()
        message = str(raised.value)
        assert "\n" not in message
        assert message == f"env worker w0 (pid {w.process.pid}) was killed by SIGKILL"
    finally:
        w.close()


def test_an_env_error_is_one_line_naming_the_worker_and_the_worker_goes_on():
    w = worker()
    try:
        w.wait_started()
        w.send(RESET)
        w.read_reply()
        w.buffers.actions[...] = fake_envs.expected_action(w.buffers.step.obs) + 1  # wrong
        w.send(STEP)
        with pytest.raises(EnvWorkerError) as raised:
            w.read_reply()
        assert "\n" not in str(raised.value)
        assert str(raised.value).startswith("w0: env.step raised AssertionError: envs")
        w.buffers.actions[...] = fake_envs.expected_action(w.buffers.step.obs)
        w.send(STEP)
        assert w.read_reply() == STEP
    finally:
        w.close()


class CloseRaises(fake_envs.CheckedEnvs):
    """CheckedEnvs whose close() raises."""

    def __call__(self, num_envs: int, seed: int):
        envs = super().__call__(num_envs, seed)

        def close():
            raise RuntimeError("cannot close")

        envs.close = close
        return envs


def test_an_env_close_that_raises_in_a_worker_is_a_warning_naming_it(capfd):
    """As in an actor thread (envs.closing): the run's results stand, the failure is said."""
    w = worker(CloseRaises())
    try:
        w.wait_started()
        pid = w.process.pid
    finally:
        w.close()
    err = capfd.readouterr().err
    assert f"env worker (pid {pid}): env.close() raised RuntimeError: cannot close" in err, err


def _raises_config_error(num_envs, seed):
    raise ConfigError("this env cannot be made here")


def test_envs_that_cannot_be_built_are_a_config_error():
    w = worker(_raises_config_error)
    try:
        with pytest.raises(ConfigError, match="^this env cannot be made here$"):
            w.wait_started()
    finally:
        w.close()


def test_a_closure_factory_travels_by_value_and_an_unsendable_one_is_a_config_error():
    episode = 3

    def closure(num_envs, seed):  # pickle cannot take it; cloudpickle sends it by value
        return fake_envs.CheckedEnvs(episode=episode)(num_envs, seed)

    check_sendable(EnvSource(EnvConfig(), factory=closure))
    w = worker(closure)
    try:
        w.wait_started()
    finally:
        w.close()

    lock = threading.Lock()

    def holds_a_lock(num_envs, seed):
        with lock:
            return fake_envs.CheckedEnvs()(num_envs, seed)

    with pytest.raises(ConfigError, match="cannot be sent to env worker processes"):
        check_sendable(EnvSource(EnvConfig(), factory=holds_a_lock))


def test_a_worker_ignores_ctrl_c():
    w = worker()
    try:
        w.wait_started()
        os.kill(w.process.pid, signal.SIGINT)
        w.send(RESET)
        assert w.read_reply() == RESET
        assert w.alive
    finally:
        w.close()
    assert not w.alive


def test_close_ends_the_process_and_restart_gives_a_fresh_one():
    w = worker()
    try:
        w.wait_started()
        first = w.process.pid
        w.kill()
        w.restart()
        w.wait_started()
        assert w.process.pid != first and w.restarts == 1
        w.send(RESET)
        assert w.read_reply() == RESET
    finally:
        w.close()
    assert w.process.poll() is not None


def test_a_worker_does_not_outlive_a_parent_killed_with_sigkill(tmp_path):
    """The parent (a Python process that started a worker) is SIGKILLed: nothing closes
    anything, and the worker still goes (PR_SET_PDEATHSIG, and EOF on its commands)."""
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, time
            from podrace.config import EnvConfig
            from podrace.envs import EnvSource
            from podrace.envs.workers import EnvWorker
            from tests.inference import fake_envs
            source = EnvSource(EnvConfig(), factory=fake_envs.CheckedEnvs())
            w = EnvWorker("w", source, fake_envs.SPEC, 2, 1, range(2))
            w.start()
            w.wait_started()
            print(w.process.pid, flush=True)
            time.sleep(600)
            """
        )
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parent = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=root),
    )
    try:
        child = int(parent.stdout.readline())
        parent.kill()
        parent.wait()

        def gone() -> bool:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                return True
            # A zombie waiting for init to reap it is gone too.
            with open(f"/proc/{child}/stat") as stat:
                return stat.read().split(")")[-1].split()[0] == "Z"

        wait_until(gone, 10)
    finally:
        parent.kill()
        parent.wait()


def _cartpoles(num_envs, seed):
    return gymnasium.make_vec("CartPole-v1", num_envs, vectorization_mode="sync")


@pytest.mark.parametrize("factory", [None, _cartpoles])
def test_a_part_keeps_only_the_observation_entries_the_whole_keeps(factory):
    """env.obs_indices applies to a part of the envs as to all of them, through a backend
    or a factory."""
    cfg = EnvConfig(id="CartPole-v1", backend="gymnasium", obs_indices=(0, 2))
    source = EnvSource(cfg, factory)
    whole, part = source.make(4, 0), source.make_part(4, 0, range(2, 4))
    try:
        assert part.spec == whole.spec and part.spec.obs_shape == (2,)
        assert part.reset().shape == (2, 2)
    finally:
        whole.close()
        part.close()
