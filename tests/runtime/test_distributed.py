"""Distributed settings without starting any process: validation, what must agree."""

from __future__ import annotations

import pytest

from podrace.cli import main
from podrace.commands.train import distributed_requested
from podrace.config import ConfigError, TrainConfig, replace
from podrace.runtime.multihost.distributed import _mismatch, config_hash, shared_fields
from podrace.validation import validate

pytestmark = pytest.mark.timeout(60)


def dist(**fields) -> TrainConfig:
    return replace(TrainConfig(), **{f"distributed.{k}": v for k, v in fields.items()})


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"coordinator": "no-port"}, "distributed.coordinator must be HOST:PORT"),
        (
            {"coordinator": "host:\u00b2"},
            "distributed.coordinator must be HOST:PORT",
        ),  # isdigit, not int
        ({"num_processes": 2}, "must be given together"),
        ({"num_processes": 2, "process_id": 2}, "distributed.process_id must be in 0..1"),
        ({"num_processes": 0, "process_id": 0}, "distributed.num_processes must be positive"),
        ({"peer_timeout_s": 0.0}, "distributed.peer_timeout_s must be positive"),
    ],
)
def test_bad_distributed_settings_are_config_errors(fields, message):
    with pytest.raises(ConfigError, match=message):
        validate(dist(**fields))


def test_total_steps_count_every_process():
    cfg = replace(TrainConfig(), total_steps=1_500, rollout_length=32, **{"env.num_envs": 8})
    assert (
        dist(num_processes=3, process_id=1).steps_per_update == 3 * TrainConfig().steps_per_update
    )
    validate(cfg)  # one process: 2 actors x 8 envs x 32 steps = 512 <= 1500
    with pytest.raises(ConfigError, match=r"less than one update \(4 processes x 2 actors"):
        validate(replace(cfg, **{"distributed.num_processes": 4, "distributed.process_id": 0}))


def test_jax_coordinator_variable_makes_a_run_distributed(monkeypatch):
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
    assert not distributed_requested(TrainConfig())
    assert distributed_requested(dist(coordinator="h:1"))
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
    assert distributed_requested(TrainConfig())


def test_config_hash_ignores_only_per_process_fields():
    a = dist(coordinator="a:1", num_processes=2, process_id=0)
    b = replace(dist(coordinator="b:1", num_processes=2, process_id=1), **{"log.run_name": "x"})
    assert config_hash(a) == config_hash(b)
    c = replace(a, **{"ppo.clip_coef": 0.3})
    assert config_hash(c) != config_hash(a)
    line = _mismatch(
        1, {"fields": shared_fields(c), "hash": "h1"}, 0, {"fields": shared_fields(a), "hash": "h0"}
    )
    assert line == (
        "config differs between processes: ppo.clip_coef is 0.3 on process 1 but 0.2 on "
        "process 0 (config hash h1 vs h0)"
    )


@pytest.mark.slow
def test_a_process_id_outside_the_run_is_refused_at_once_without_reaching_the_meeting(
    capsys, tmp_path
):
    """Process 5 of 2 has no place in the run: its one-line error comes before it tries to
    reach process 0's meeting (which would refuse such a process anyway), so it neither
    waits nor disturbs the meeting of the real processes."""
    import socket

    with socket.socket() as meeting:  # where process 0's meeting listens
        meeting.bind(("127.0.0.1", 0))
        meeting.listen(4)
        meeting.setblocking(False)
        code = main(
            [
                "train",
                "cartpole-ppo",
                "--log.run-dir",
                str(tmp_path),
                "--distributed.num-processes",
                "2",
                "--distributed.process-id",
                "5",
                "--distributed.coordinator",
                f"127.0.0.1:{meeting.getsockname()[1]}",
            ]
        )
        with pytest.raises(BlockingIOError):  # nobody connected
            meeting.accept()
    err = capsys.readouterr().err
    assert (
        code == 2 and err.strip() == "podrace: error: distributed.process_id must be in 0..1, got 5"
    )
    assert not list(tmp_path.iterdir())


@pytest.mark.timeout(60)
def test_a_process_stopped_before_its_hello_tells_the_meeting_so_no_one_waits_for_it():
    """Ctrl-C on process 1 before it reached process 0 is told to the meeting: process 0 does
    not wait out --distributed.init-timeout-s, then blame a process that never started."""
    import threading

    from podrace.config import DistributedConfig
    from podrace.control import Stopped
    from podrace.runtime.multihost.distributed import meet
    from podrace.runtime.multihost.rendezvous import rendezvous
    from tests.runtime.multihost_processes import free_port
    from tests.waiting import wait_until

    coordinator = f"127.0.0.1:{free_port()}"
    was_stopped = threading.Event()

    def stopped():
        was_stopped.set()
        raise Stopped("SIGINT received")

    def process_1():
        with pytest.raises(Stopped):
            meet(DistributedConfig(coordinator, 2, 1, init_timeout_s=30), stopped)

    leaving = threading.Thread(target=process_1)
    leaving.start()
    wait_until(was_stopped.is_set)  # process 0 starts its meeting after process 1 was stopped
    with pytest.raises(ConfigError) as refused:  # its timeout would be another error
        rendezvous(coordinator, 2, 0, 20.0)
    leaving.join(30)
    assert not leaving.is_alive()
    assert (
        "process 1 cannot run: it was stopped before every process had joined (SIGINT received)"
        in str(refused.value)
    )
