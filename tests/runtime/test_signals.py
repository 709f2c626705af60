"""`podrace train` under SIGINT/SIGTERM: never lost, never an abort, out within seconds."""

import json
import random
import re
import signal
import time
from pathlib import Path

import pytest

from podrace.checkpoints.state import checkpoint_dir
from podrace.checkpoints.steps import checkpoint_steps
from tests.helpers.cli import EXIT_SLACK_S, podrace_env, start_podrace, start_train
from tests.waiting import wait_until


def handlers_installed(pid: int) -> bool:
    """podrace's handler for SIGTERM is in place (Python's own catches only SIGINT)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    caught = int(next(ln for ln in status.splitlines() if ln.startswith("SigCgt:")).split()[1], 16)
    return bool(caught >> (signal.SIGTERM - 1) & 1)


def stop_and_check(proc, signum, metrics: Path, every_thread_returns: bool = False) -> float:
    sent = time.monotonic()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    elapsed = time.monotonic() - sent
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err and "terminate called" not in err, err
    if metrics.exists() and metrics.read_text().strip():
        assert json.loads(metrics.read_text().splitlines()[-1])["final"] == 1
    assert elapsed <= EXIT_SLACK_S, (elapsed, err)
    if every_thread_returns:  # no thread was abandoned (the loops saw the stop)
        assert "left behind" not in err, err
    proc.err = err
    return elapsed


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_early_signals_are_never_lost_nor_abort(tmp_path):
    rng = random.Random(0)
    exits = []
    # Half in the first 2 s (parsing, imports), half later (compile, first updates).
    delays = [rng.uniform(0, 2) for _ in range(4)] + [rng.uniform(2, 8) for _ in range(4)]
    for i, delay in enumerate(delays):
        signum = (signal.SIGINT, signal.SIGTERM)[i % 2]
        proc = start_train(tmp_path / str(i), "--total-steps", "100000000")
        try:
            wait_until(lambda p=proc: handlers_installed(p.pid), 30, while_alive=proc)
            time.sleep(delay)  # the signal lands at a random moment: the point of the test
            exits.append(stop_and_check(proc, signum, tmp_path / str(i) / "r" / "metrics.jsonl"))
        finally:
            proc.kill()
            proc.wait()
    print("exit after signal (s):", [f"{d:.1f}->{e:.2f}" for d, e in zip(delays, exits)])


def wait_for_line(proc, metrics: Path, ok, timeout=120):
    def last_line_ok() -> bool:
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        return bool(lines) and ok(json.loads(lines[-1]))

    wait_until(last_line_ok, timeout, while_alive=proc)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_stop_during_a_long_evaluation(tmp_path):
    proc = start_train(
        tmp_path, "--total-steps", "4096", "--eval.episodes", "100000000", "--eval.num-envs", "1"
    )
    try:
        metrics = tmp_path / "r" / "metrics.jsonl"
        wait_for_line(proc, metrics, lambda line: line.get("env_steps", 0) >= 4096)
        # The final checkpoint is written while the final evaluation runs (it never ends).
        wait_until(lambda: checkpoint_steps(checkpoint_dir(tmp_path / "r")), 120, while_alive=proc)
        elapsed = stop_and_check(proc, signal.SIGINT, metrics, every_thread_returns=True)
        print(f"exit {elapsed:.2f}s after SIGINT during evaluation")
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_second_signal_exits_at_once(tmp_path):
    proc = start_train(tmp_path, "--total-steps", "100000000")
    try:
        metrics = tmp_path / "r" / "metrics.jsonl"
        wait_for_line(proc, metrics, lambda line: line.get("env_steps", 0) > 0)
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode in (128 + signal.SIGINT, 128 + signal.SIGTERM), err
        assert "Traceback" not in err, err
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_second_signal_names_the_checkpoint_the_run_leaves(tmp_path):
    """Exiting at once on a second signal, the one line says which checkpoint is complete
    (a save the first signal started may be cut short): the one a resume continues."""
    proc = start_train(
        tmp_path,
        *("--total-steps", "100000000", "--checkpoint.every-updates", "2"),
        *("--checkpoint.keep", "1000"),
    )
    try:
        folder = checkpoint_dir(tmp_path / "r")
        metrics = tmp_path / "r" / "metrics.jsonl"
        # A checkpoint the run has counted as complete (its metric), not only one on disk:
        # the step's folder appears just before the run records it.
        wait_until(
            lambda: (
                metrics.is_file()
                and any("checkpoint/version" in line for line in metrics.read_text().splitlines())
            ),
            120,
            while_alive=proc,
        )
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    line = err.strip().splitlines()[-1]
    said = re.fullmatch(
        r"podrace: second SIG(INT|TERM), exiting now; checkpoint ([0-9]+) is the latest "
        rf"complete \(podrace train --resume {re.escape(str(tmp_path / 'r'))}\)"
        r"(; checkpoint [0-9]+ was being written and is discarded)?",
        line,
    )
    assert said, err
    assert int(said.group(2)) in checkpoint_steps(folder)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_signal_during_a_compile_longer_than_the_grace_leaves_no_run_dir(tmp_path):
    """A signal while XLA compiles the learner, for longer than the grace period, exits
    without leaving a run folder that holds only config.json."""
    compiling = tmp_path.parent / f"{tmp_path.name}.compiling"  # the run dir stays empty
    code = (
        "import sys, time\n"
        "import podrace.runtime.skeleton as sh\n"
        f"compiling = {str(compiling)!r}\n"
        "def warm_up_learner(*a, **k):  # a compile that outlasts the grace\n"
        "    open(compiling, 'w').close()\n"
        "    time.sleep(60)\n"
        "sh.warm_up_learner = warm_up_learner\n"
        "from podrace.cli import main\n"
        f"sys.exit(main(['train', 'cartpole-ppo', '--log.run-dir', {str(tmp_path)!r}, "
        "'--log.run-name', 'r', '--log.console', 'none']))\n"
    )
    proc = start_podrace(script=code)
    try:
        wait_until(compiling.exists, 90, while_alive=proc)
        stop_and_check(proc, signal.SIGINT, tmp_path / "r" / "metrics.jsonl")
        assert list(tmp_path.iterdir()) == []
        # one line, and only one of these: the stop is not reported both ways
        lines = proc.err.strip().splitlines()
        assert len(lines) == 1 and lines[0] in (
            "podrace: SIGINT received, stopped cleanly",  # the stop came before the long compile
            "podrace: SIGINT received, stopped; threads still busy in native code are left behind",
        ), lines
    finally:
        proc.kill()
        proc.wait()


GIL_HOLDING_ENV = '''
import ctypes, os, gymnasium, numpy as np

class GilHolding(gymnasium.Env):
    """CartPole-like; its 40th step sleeps in C while holding the GIL, as a native
    extension that never releases it would."""
    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)
    steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action):
        GilHolding.steps += 1
        if GilHolding.steps == 40:
            open(os.environ["HELD_MARK"], "w").close()
            ctypes.PyDLL(None).sleep(1000)
        return np.zeros(4, np.float32), 1.0, False, False, {}

gymnasium.register("GilHolding-v0", entry_point=GilHolding)
'''


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_native_call_holding_the_gil_cannot_keep_the_process_forever(tmp_path):
    """An env step stuck in C with the GIL held starves the watchdog and both signal handlers
    (SIGTERM, SIGINT, SIGINT go unanswered); the C-level last resort still ends the process,
    with every thread's stack."""
    (tmp_path / "gilenv.py").write_text(GIL_HOLDING_ENV)
    code = (
        "import sys\n"
        "import podrace.commands.supervisor as supervisor\n"
        "from podrace.cli import main\n"
        "supervisor.STARVED_EXIT_S = 4.0\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    mark = tmp_path / "held"
    proc = start_podrace(
        "train",
        "cartpole-ppo",
        "--env.id",
        "gilenv:GilHolding-v0",
        "--env.num-envs",
        "2",
        "--log.run-dir",
        str(tmp_path / "runs"),
        "--log.console",
        "none",
        "--safety.watchdog-s",
        "1",
        script=code,
        cwd=tmp_path,
        env=podrace_env(HELD_MARK=str(mark)),
    )
    try:
        wait_until(mark.exists, 90, while_alive=proc)
        held = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        elapsed = time.monotonic() - held
        assert proc.returncode == 1, err
        assert "Timeout" in err and "in step" in err and "gilenv.py" in err, err
        assert elapsed < 4.0 + 1.0 + EXIT_SLACK_S, elapsed
    finally:
        proc.kill()
        proc.wait()
