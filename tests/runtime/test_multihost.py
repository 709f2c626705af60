"""Several processes, one learner mesh (jax.distributed, gloo, forced CPU devices).

Every test starts its processes in their own process groups and kills the groups in
`finally`, so a failing test leaves nothing behind.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from tests.helpers.cli import ENDLESS, run_flags
from tests.runtime.multihost_processes import (
    both_processes,
    finish,
    free_port,
    last_line_starting,
    podrace_train,
    processes,
    service_child,
    wait_for_metrics,
    worker_commands,
)
from tests.waiting import wait_until


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "normalized"])
def test_two_processes_compute_the_updates_of_one_with_two_learner_devices(tmp_path, normalize):
    # Normalizing, the statistics (and the tracker of every env's return) are global arrays
    # over both processes; placed per process, a run failed while preparing.
    from tests.runtime import multihost_worker as worker

    port = free_port()
    out = str(tmp_path / "params")
    commands = worker_commands(port, out, after=["normalize"] if normalize else [])
    with processes(commands) as procs:
        results = finish(procs, 200)
    for code, _, err in results:
        assert code == 0, err[-3000:]
    assert len(jax.devices()) >= 2
    reference = jax.tree.leaves(worker.train(jax.devices()[:2], 1, 0, normalize))
    for p in range(2):
        got = np.load(f"{out}.{p}.npz")
        assert len(got.files) == len(reference)
        for i, ref in enumerate(reference):
            np.testing.assert_allclose(got[str(i)], ref, rtol=1e-4, atol=1e-5)
    initial = jax.tree.leaves(worker.initial_params(normalize))
    assert max(float(np.abs(np.asarray(a) - b).max()) for a, b in zip(initial, reference)) > 0


def short_run(tmp_path) -> tuple[str, ...]:
    """Flags of a run of 4096 env steps under `tmp_path` (for runs the processes refuse)."""
    return ("--log.run-dir", str(tmp_path), "--total-steps", "4096")


def one_line_error(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


@pytest.mark.timeout(180)
def test_config_mismatch_is_one_line_and_exit_2_on_every_process(tmp_path):
    port = free_port()
    base = short_run(tmp_path)
    commands = [
        podrace_train(0, port, *base),
        podrace_train(1, port, *base, "--env.num-envs", "16"),
    ]
    with processes(commands) as procs:
        results = finish(procs, 150)
    for process, (code, _, err) in enumerate(results):
        assert code == 2, err[-3000:]
        line = one_line_error(err)
        assert line.startswith(
            "podrace: error: config differs between processes: env.num_envs is"
        ), line
        assert f"on process {process}" in line
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_process_that_never_starts_or_a_wrong_count_is_one_line_and_exit_2(tmp_path):
    """jax.distributed aborts a process whose peers miss its deadline (exit 134, a C++ stack
    trace); the processes now meet first and say what is wrong."""
    port = free_port()
    timeout = ("--distributed.init-timeout-s", "3", "--log.run-dir", str(tmp_path))
    with processes([podrace_train(0, port, *timeout)]) as procs:
        [(code, _, err)] = finish(procs, 90)
    assert code == 2, err[-3000:]
    assert one_line_error(err).startswith(
        "podrace: error: distributed: process(es) [1] did not join within 3s"
    )

    commands = [podrace_train(0, port, *timeout), podrace_train(1, port, *timeout, processes=3)]
    with processes(commands) as procs:
        results = finish(procs, 90)
    for code, _, err in results:
        assert code == 2, err[-3000:]
        assert "process 0 says 2, process 1 says 3" in one_line_error(err)
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.timeout(120)
def test_an_invalid_config_on_process_1_refuses_the_run_on_every_process_at_once(tmp_path):
    """Process 1 exits 2 at once, and so does process 0: it does not wait out
    --distributed.init-timeout-s for process 1 and then blame the coordinator address."""
    port = free_port()
    base = (*short_run(tmp_path), "--distributed.init-timeout-s", "100")
    commands = [podrace_train(0, port, *base), podrace_train(1, port, *base, "--env.num-envs", "0")]
    with processes(commands) as procs:  # within 90 s: before process 0's init timeout
        (code0, _, err0), (code1, _, err1) = finish(procs, 90)
    # Process 0's own line names process 1's refusal, not its coordinator (its timeout's).
    assert (
        code1 == 2
        and one_line_error(err1) == "podrace: error: env.num_envs must be positive, got 0"
    ), err1[-3000:]
    assert code0 == 2 and one_line_error(err0) == (
        "podrace: error: distributed: process 1 cannot run: env.num_envs must be positive, got 0"
    ), err0[-3000:]
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.timeout(180)
def test_a_layout_error_on_one_process_stops_every_process_with_exit_2(tmp_path):
    port = free_port()
    base = (*short_run(tmp_path), "--layout.learner-device-ids", "1")
    # Process 1 has the second CPU device the layout names; process 0 does not.
    commands = [
        podrace_train(0, port, *base),
        podrace_train(1, port, *base, "--layout.cpu-devices", "2"),
    ]
    with processes(commands) as procs:
        results = finish(procs, 150)
    codes = [code for code, _, _ in results]
    assert codes == [2, 2], [err[-2000:] for _, _, err in results]
    assert "device 1 does not exist" in one_line_error(results[0][2])
    assert "process 0" in one_line_error(results[1][2])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_error_in_process_1_fails_process_0_naming_it(tmp_path):
    port = free_port()
    commands = worker_commands(port, "fault", str(tmp_path))
    with processes(commands) as procs:
        (code0, _, err0), (code1, _, err1) = finish(procs, 240)
    assert (
        code1 == 1
        and "podrace: error: actor-0 failed: EnvError: env.step raised at step 200" in err1
    ), err1[-3000:]
    # A save needs every process, and process 0 leaves on hearing of the failure: process 1
    # does not wait the peer timeout for an agreement on a last checkpoint.
    assert "no last checkpoint" not in err1, err1[-3000:]
    assert code0 == 1, err0[-3000:]
    last = last_line_starting(err0, "podrace: error:")
    assert last.startswith(
        "podrace: error: process-1 failed: PeerLost: process 1 failed: actor-0 failed: EnvError"
    ), last


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "signum,both",
    [(signal.SIGTERM, False), (signal.SIGINT, True)],
    ids=["SIGTERM", "SIGINT-to-both"],
)
def test_a_signal_to_one_process_stops_every_process(tmp_path, signum, both):
    """SIGTERM: podrace's handler, not JAX's preemption notifier, gets it (the run must not go
    on). A signal to every process at once: each reports its own, not another process's.
    SIGINT to one process: test_while_process_1_waits_for_process_0s_final_evaluation."""
    port = free_port()
    flags = (
        *run_flags(tmp_path, ENDLESS),
        "--log.interval-s",
        "0.2",
        "--layout.actors-per-device",
        "1",
    )
    with processes(both_processes(port, *flags)) as procs:
        wait_for_metrics(tmp_path / "r" / "metrics.jsonl", procs)
        procs[1].send_signal(signum)
        if both:
            procs[0].send_signal(signum)
        results = finish(procs, 60)
    (code0, _, err0), (code1, _, err1) = results
    name = signal.Signals(signum).name
    assert code1 == 128 + signum and f"{name} received" in err1, err1[-3000:]
    line0 = f"podrace: {name} received" if both else f"process 1 received {name}"
    assert code0 == 128 + signum and line0 in err0 and (not both or "process 1" not in err0), err0[
        -3000:
    ]
    # Process 0's coordination service was stopped with it: a new run can start on the port.
    wait_for_port_freed(port, 5.0)


def port_free(port: int) -> bool:
    from podrace.runtime.multihost.rendezvous import listen_on_all_addresses

    try:
        listen_on_all_addresses(port).close()
        return True
    except OSError:
        return False


def wait_for_port_freed(port: int, timeout: float) -> None:
    """Within `timeout` s (an orphaned service would keep it for LINGER_S, 10 s)."""
    wait_until(lambda: port_free(port), timeout, lambda: f"port {port} still taken")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("stopped", [0, 1])
def test_ctrl_c_before_the_first_update_leaves_no_run_directory(tmp_path, stopped):
    """As for one process: a run stopped before its first update holds no checkpoint, so no
    run directory is left (neither process 0's nor process 1's part inside it). Process 1
    interrupted while compiling must not abort (exit 134), which it would if process 0, the
    holder of JAX's coordination service, exited before it."""
    port = free_port()
    flags = (
        *run_flags(tmp_path),
        "--layout.actors-per-device",
        "1",
    )
    with processes(both_processes(port, *flags)) as procs:
        wait_until((tmp_path / "r" / "process-1" / "config.json").exists, 120, while_alive=procs)
        procs[stopped].send_signal(signal.SIGINT)
        results = finish(procs, 60)
    (code, _, err), (other_code, _, other_err) = results[stopped], results[1 - stopped]
    assert code == 130 and "SIGINT received" in err and "Terminating process" not in err, err[
        -3000:
    ]
    assert (
        other_code == 130 and f"podrace: process {stopped} received SIGINT, stopped" in other_err
    ), other_err[-3000:]
    assert not (tmp_path / "r").exists()
    wait_for_port_freed(port, 3.0)  # process 0 stopped its coordination service as it left


@pytest.mark.timeout(180)
@pytest.mark.parametrize("killed", [0, 1])
def test_a_process_killed_while_joining_jax_distributed_ends_the_other_with_one_line(
    tmp_path, killed
):
    """Between process 0's service start and the end of preparation (JAX's registration, the
    config agreement) the peer link is already open: a killed process 0 ends process 1 with
    one line, not JAX's abort once its service is gone (exit -6), and a killed process 1
    does not leave process 0 waiting for JAX's heartbeat (100 s)."""
    port = free_port()
    flags = (
        *run_flags(tmp_path),
        "--layout.actors-per-device",
        "1",
    )
    with processes(both_processes(port, *flags)) as procs:
        wait_until(lambda: service_child(procs[0].pid), 120, while_alive=procs)
        os.killpg(procs[killed].pid, signal.SIGKILL)
        survivor = procs[1 - killed]
        survivor.wait(60)  # before JAX's heartbeat (100 s) could end it
        _, err = survivor.communicate()
    assert survivor.returncode == 1, (survivor.returncode, err[-3000:])
    # The closed connection ended it (at once), not a silence the link waited out.
    last = last_line_starting(err)
    assert last.startswith(
        f"podrace: error: process-{killed} failed: PeerLost: process {killed} closed"
    ), last
    assert "Terminating process" not in err
    if killed == 1:
        wait_for_port_freed(port, 3.0)  # process 0 stopped its coordination service as it left


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_on_process_1_once_process_0_trains_but_before_any_update_leaves_no_run_directory(
    tmp_path,
):
    """The stop reaches process 0 after its preparation (threads running, no update yet: its
    env steps take 2 s here): its run directory goes too."""
    port = free_port()
    commands = worker_commands(port, "slow", str(tmp_path))
    with processes(commands) as procs:
        # process 0's run has started
        wait_until((tmp_path / "r" / "metrics.jsonl").exists, 120, while_alive=procs)
        procs[1].send_signal(signal.SIGINT)
        (code0, _, err0), (code1, _, err1) = finish(procs, 60)
    assert code1 == 130 and "SIGINT received" in err1, err1[-3000:]
    assert code0 == 130 and "podrace: process 1 received SIGINT, stopped" in err0, err0[-3000:]
    assert not (tmp_path / "r").exists(), sorted(p.name for p in (tmp_path / "r").rglob("*"))


def wait_for_final_line(path: Path, procs, timeout: float = 150) -> None:
    """Until `path` (a process's metrics.jsonl) has its run's `final: 1` line."""
    wait_until(
        lambda: path.exists() and '"final": 1' in path.read_text(),
        timeout,
        lambda: "process never finished its run",
        while_alive=procs,
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "event", ["SIGINT to process 1", "SIGKILL of process 0", "SIGKILL of process 1"]
)
def test_while_process_1_waits_for_process_0s_final_evaluation(tmp_path, event):
    """Process 1 finished and waits for process 0 (a long final evaluation). Ctrl-C there
    ends it without waiting for process 0 to be done (the wait is not JAX's shutdown barrier
    at exit), and process 0 killed meanwhile does not abort process 1 (exit 134, a C++ stack
    trace)."""
    port = free_port()
    flags = (
        *run_flags(tmp_path, 4096),
        "--eval.episodes",
        "200000",
        "--eval.num-envs",
        "16",
        "--eval.every-updates",
        "0",
        "--layout.actors-per-device",
        "1",
    )
    with processes(both_processes(port, *flags)) as procs:
        wait_for_final_line(tmp_path / "r" / "process-1" / "metrics.jsonl", procs)
        # Nothing outside marks process 1's wait: the half second lets it get there. Landing
        # earlier on a loaded machine, the event meets the same end of the run, as expected.
        time.sleep(0.5)
        assert procs[0].poll() is None and procs[1].poll() is None  # process 0 still evaluates
        if event.startswith("SIGINT"):
            procs[1].send_signal(signal.SIGINT)
        else:
            os.killpg(procs[int(event[-1])].pid, signal.SIGKILL)
        # A survivor that waited for process 0's evaluation (200,000 episodes: hours) or for
        # JAX's shutdown barrier would still run here; its exit code and line say which end
        # it met.
        survivor = procs[0] if event.endswith("1") else procs[1]
        survivor.wait(120)
        results = finish(procs, 60)
    (code0, _, err0), (code1, _, err1) = results
    if event == "SIGKILL of process 1":  # after it said done: process 0 still evaluated
        assert code0 == 1, err0[-3000:]
        last = last_line_starting(err0)
        assert last.startswith(
            "podrace: error: process-1 failed: PeerLost: process 1 closed its connection"
        ), last
    elif event.startswith("SIGINT"):
        assert code1 == 130 and "SIGINT received" in err1, err1[-3000:]
        assert code0 == 130 and "process 1 received SIGINT" in err0, err0[-3000:]
    else:
        assert code1 == 1, err1[-3000:]
        last = last_line_starting(err1)
        assert last.startswith(
            "podrace: error: process-0 failed: PeerLost: process 0 closed its connection"
        ), last


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_cartpole_ppo_learns_over_two_processes(tmp_path):
    """The single-host learning test's run (2 actors x 8 envs), one actor per process
    (seed 1 evaluates 500 after these 60k steps, 309 after 40k)."""
    port = free_port()
    flags = (
        *run_flags(tmp_path, 60_000),
        "--rollout-length",
        "32",
        "--seed",
        "1",
        "--env.num-envs",
        "8",
        "--layout.actors-per-device",
        "1",
        "--ppo.num-minibatches",
        "4",
        "--eval.episodes",
        "8",
        "--eval.num-envs",
        "8",
    )
    with processes(both_processes(port, *flags)) as procs:
        results = finish(procs, 850)
    for code, _, err in results:
        assert code == 0, err[-3000:]
    out0 = results[0][1]
    final = float(out0.split("final eval return ")[1].split()[0].rstrip(","))
    assert final >= 150, out0
    assert (tmp_path / "r" / "metrics.jsonl").exists()
    assert (tmp_path / "r" / "process-1" / "metrics.jsonl").exists()
    assert "no final evaluation" in results[1][1]
