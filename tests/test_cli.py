import errno
import importlib.util
import json
import os
import signal
import subprocess
import sys

import pytest

from podrace.cli import main
from tests.helpers.cli import (
    ENDLESS,
    run_cli,
    run_flags,
    run_podrace,
    start_train,
    start_two_device_train,
)
from tests.helpers.runs import metric_lines
from tests.waiting import wait_until


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--env.num-envs", "0"], "env.num_envs must be positive"),
        (["--env.num-threads", "0"], "env.num_threads must be positive"),
        (["--env.num-threads", "-2"], "env.num_threads must be positive"),
        # unchecked, this many threads would abort the process
        (["--env.num-threads", "2147483647"], "env.num_threads must be at most 1024"),
        (["--layout.learner-device-ids", "0", "1", "2", "--env.num-envs", "8"], "divisible"),
        (["--env.id", "NoSuchEnv-v0"], "unknown env id"),
        (["--rollout-length", "-3"], "rollout_length must be positive"),
        (["--total-steps", "10"], "less than one update"),
        # unchecked, "" would silently be the working directory
        (["--log.run-dir", ""], "log.run_dir must name a folder"),
        (["--env.obs-indices", "1", "1"], "env.obs_indices names entry 1 twice"),
    ],
)
def test_bad_config_is_one_line_and_exit_2(capsys, tmp_path, flags, message):
    code, out, err = run_cli(
        capsys, "train", "cartpole-ppo", "--log.run-dir", str(tmp_path), *flags
    )
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--env.workers", "two"], "--env.workers"),
        (["--env.workers", "-2"], "env.workers must be >= 0, got -2"),
        (["--env.workers", "5000"], "env.workers must be at most 1024, got 5000"),
        (["--env.workers", "128"], "env.num_envs (64) must be a multiple of env.workers (128)"),
        (["--layout.inference", "server"], "set --env.workers >= 1"),
        (["--layout.inference", "gpu", "--env.workers", "2"], "--layout.inference"),
        (
            ["--layout.inference", "server", "--env.workers", "2", "--network.core", "lstm"],
            "env.workers does not carry a recurrent core's state (network.core lstm)",
        ),
        (
            ["--layout.inference", "server", "--env.workers", "2", "--inference.max-batch", "4"],
            "inference.max_batch (4) must be at least one worker's envs (32), or 0",
        ),
        (
            ["--env.workers", "2", "--runtime", "ray"],
            "env.workers with --runtime ray needs --layout.inference server",
        ),
    ],
)
def test_bad_env_workers_or_inference_config_is_one_line_and_exit_2_before_threads(
    capsys, tmp_path, flags, message
):
    import threading

    before = set(threading.enumerate())
    code, out, err = run_cli(
        capsys, "train", "cartpole-ppo", "--log.run-dir", str(tmp_path), *flags
    )
    assert (code, len(err.strip().splitlines())) == (2, 1), err
    assert message in err
    assert set(threading.enumerate()) <= before  # nothing started
    assert not list(tmp_path.iterdir())


def test_unknown_preset_exits_2_in_one_line(capsys):
    code, out, err = run_cli(capsys, "train", "no-such-preset")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(
        "podrace: error: Unrecognized options: no-such-preset; Available subcommands: cartpole-ppo,"
    )
    assert err.strip().endswith("(see podrace train --help)")


def test_help_lists_flags(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", "cartpole-ppo", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--env.num-envs", "--layout.max-policy-lag", "--ppo.clip-coef", "--total-steps"):
        assert flag in out


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_run_of_one_update_says_1_update(capsys, tmp_path):
    code, out, err = run_cli(
        capsys,
        *("train", "cartpole-ppo", "--log.run-dir", str(tmp_path), "--log.console", "none"),
        *("--total-steps", "512", "--eval.episodes", "1", "--eval.num-envs", "1"),
    )
    assert code == 0, err
    assert out.startswith("done: 512 env steps, 1 update in "), out


@pytest.mark.timeout(120)
def test_train_runs_and_reports(capsys, tmp_path):
    code, out, err = run_cli(
        capsys,
        "train",
        "cartpole-ppo",
        *run_flags(tmp_path, 4096),
        "--log.console",
        "none",
        "--eval.episodes",
        "2",
    )
    assert code == 0, err
    assert "done: 4,096 env steps" in out
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["total_steps"] == 4096
    code, out, err = run_cli(capsys, "train", "cartpole-ppo", *run_flags(tmp_path))
    assert code == 2 and "already exists" in err


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_training_run_outlives_the_reader_of_its_stderr(tmp_path):
    """`podrace train ... 2>&1 | head -1` trains to the end: lines nobody reads are lost, not
    the run (rich's console raises SystemExit on a broken pipe)."""
    run = start_train(
        tmp_path, "--total-steps", "20480", "--eval.episodes", "2", console="lines", interval_s=0.05
    )
    try:
        run.stderr.close()  # the reader has gone before the first line
        out, _ = run.communicate(timeout=100)
    finally:
        run.kill()
        run.wait()
    assert run.returncode == 0 and out.startswith("done: 20,480 env steps"), out
    assert (tmp_path / "r" / "checkpoints" / "40").is_dir()


def full_pipe() -> tuple[int, int]:
    """A pipe whose reader is there but reads nothing, filled to the brim (`2>&1 | less`, not
    scrolled)."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    try:
        while True:
            os.write(write, b"x" * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(write, True)
    return read, write


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_signal_ends_a_run_whose_stderr_reader_stopped_reading(tmp_path):
    """With stderr a full pipe nobody reads, a Ctrl-C still ends the process: the main thread
    never blocks for long in a write to it."""
    read, write = full_pipe()
    try:
        run = start_train(
            tmp_path, "--total-steps", "100000000", console="lines", interval_s=0.05, stderr=write
        )
        os.close(write)
        metrics = tmp_path / "r" / "metrics.jsonl"
        wait_until(
            lambda: metrics.exists() and metrics.read_text().count("\n") >= 2, 90, while_alive=run
        )
        run.send_signal(signal.SIGINT)
        run.wait(15)
    finally:
        if run.poll() is None:  # the hang this test is about: leave no process behind
            run.kill()
            run.wait()
        os.close(read)
    assert run.returncode == 130
    assert json.loads(metrics.read_text().splitlines()[-1])["final"] == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stderr", ["2>&-", "2>/dev/full"])
def test_a_bad_flag_with_stderr_closed_or_full_is_still_exit_2_and_nothing_on_stdout(
    tmp_path, stderr
):
    """A bad flag is exit 2 with nothing on stdout (no traceback, no error line moved to
    stdout) whether stderr is full or closed; a closed fd 2 is taken by /dev/null, so no
    file the run opens gets its number and with it crash dumps and C libraries' log lines."""
    probe = (
        "import os, sys, podrace.cli as c; c.guard_std_streams(); "
        "print(os.readlink('/proc/self/fd/2'))"
    )
    done = subprocess.run(
        f'"{sys.executable}" -c "{probe}" {stderr}',
        shell=True,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.stdout.strip() == ("/dev/null" if stderr == "2>&-" else "/dev/full")
    done = subprocess.run(
        f'"{sys.executable}" -m podrace.cli train cartpole-ppo --bogus {stderr}',
        shell=True,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
        timeout=50,
    )
    assert (done.returncode, done.stdout) == (2, "")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args,code", [("--bogus", 2), ("--help", 0)])
def test_a_flag_error_or_help_with_stdout_closed_is_its_usual_exit(tmp_path, args, code):
    """With stdout closed, sys.stdout is None where tyro writes: still the usual exit code and
    no traceback."""
    done = subprocess.run(
        f'"{sys.executable}" -m podrace.cli train cartpole-ppo {args} >&-',
        shell=True,
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
        timeout=50,
    )
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "args", [["--help"], ["train", "cartpole-ppo", "--help"]], ids=["usage", "flags"]
)
def test_help_into_a_full_stdout_is_one_line_and_exit_1(tmp_path, args):
    with open("/dev/full", "w") as full:
        done = run_podrace(*args, stdout=full, stderr=subprocess.PIPE, timeout=50)
    assert done.returncode == 1 and done.stderr.splitlines() == [
        "podrace: error: could not write to stdout (No space left on device); "
        "the command itself succeeded"
    ]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_missing_env_package_is_one_line_without_dependency_warnings_ahead(tmp_path):
    """Gymnasium's coloured "HalfCheetah-v4 is out of date" note came before podrace's line
    (in a child process: pytest captures warnings in its own)."""
    if importlib.util.find_spec("mujoco") is not None:
        pytest.skip("MuJoCo is installed here: the env can be made")
    done = run_podrace(
        "train",
        "mujoco-ppo",
        "--env.backend",
        "gymnasium",
        "--log.run-dir",
        str(tmp_path),
        timeout=50,
    )
    assert done.returncode == 2
    assert (
        done.stderr.startswith("podrace: error: env 'HalfCheetah-v4' cannot be made")
        and done.stderr.count("\n") == 1
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "signum", [signal.SIGTERM]
)  # SIGINT: tests/commands/test_train_resume.py's, at a random time test_signals'
def test_signal_stops_cleanly_with_conventional_exit_code(tmp_path, signum):
    proc = start_train(tmp_path, "--total-steps", "100000000")
    metrics = tmp_path / "r" / "metrics.jsonl"
    try:
        wait_until(
            lambda: metrics.exists() and metrics.read_text().count("\n") >= 2,
            120,
            while_alive=proc,
        )
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    # A clean stop, not one forced after the exit grace: its code and its own line.
    assert proc.returncode == 128 + signum, err
    assert "stopped cleanly" in err
    last = json.loads(metrics.read_text().splitlines()[-1])
    assert last["final"] == 1 and last["env_steps"] > 0


def fake_train(monkeypatch, result=None, error=None):
    """Stand in for the runtime: the CLI's reporting is what is tested here."""
    from podrace.runtime import run as runs
    from podrace.runtime.cluster import OneProcess

    class FakeRun:
        stuck: list[str] = []
        cluster = OneProcess()

        def run(self):
            if error is not None:
                raise error
            return result

    monkeypatch.setattr(runs, "prepare", lambda *args, **kwargs: FakeRun())


@pytest.mark.timeout(60)
def test_final_line_reports_skipped_updates(capsys, tmp_path, monkeypatch):
    from podrace.runtime.run import TrainResult

    result = TrainResult(
        tmp_path / "r",
        updates=625,
        env_steps=320_000,
        compile_s=1.0,
        train_s=9.0,
        learn_s=8.0,
        final_eval=None,
        max_policy_lag=1.0,
        skipped_updates=12,
    )
    fake_train(monkeypatch, result=result)
    code, out, err = run_cli(capsys, "train", "cartpole-ppo", "--log.run-dir", str(tmp_path))
    assert code == 0, err
    assert "done: 320,000 env steps, 625 updates (12 skipped as non-finite)" in out


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "component,error,message",
    [
        ("learner", "skipped", "learner failed: TooManySkippedUpdates: 63 of 625 updates skipped"),
        (
            "logger",
            "sink",
            "logger failed: SinkError: cannot write metrics to m.jsonl: No space left on device",
        ),
        (
            "actor-0",
            "hang",
            "actor-0 failed: HangDetected: env.step did not return within 3s (step 305)",
        ),
        # one line: no traceback of podrace's own frames before it
        (
            "actor-0",
            "outside",
            "actor-0 failed: EnvError: env.step raised at step 5: ObservationOutsideSpace: got [5]",
        ),
    ],
)
def test_named_failures_are_one_line_and_exit_1(
    capsys, tmp_path, monkeypatch, component, error, message
):
    from podrace.actor import EnvError
    from podrace.control import ComponentError, HangDetected
    from podrace.envs.spaces import ObservationOutsideSpace
    from podrace.learner import TooManySkippedUpdates
    from podrace.metrics.loggers import SinkError

    cause = {
        "skipped": TooManySkippedUpdates("63 of 625 updates skipped as non-finite"),
        "sink": SinkError("cannot write metrics to m.jsonl: No space left on device"),
        "hang": HangDetected("env.step did not return within 3s (step 305)"),
        "outside": EnvError("env.step raised at step 5: ObservationOutsideSpace: got [5]"),
    }[error]
    cause.__cause__ = ObservationOutsideSpace("got [5]") if error == "outside" else None
    fake_train(monkeypatch, error=ComponentError(component, cause))
    code, out, err = run_cli(capsys, "train", "cartpole-ppo", "--log.run-dir", str(tmp_path))
    assert code == 1
    (line,) = err.strip().splitlines()
    assert line.startswith(f"podrace: error: {message}")


@pytest.mark.timeout(60)
def test_wandb_missing_is_exit_2_and_writes_nothing(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    code, out, err = run_cli(
        capsys, "train", "cartpole-ppo", "--log.run-dir", str(tmp_path / "runs"), "--log.wandb"
    )
    assert code == 2
    assert err.strip().splitlines() == [
        "podrace: error: log.wandb needs the wandb package: pip install 'podrace[wandb]'"
    ]
    assert not list(tmp_path.iterdir())


@pytest.mark.timeout(30)
def test_a_full_disk_explains_itself_in_one_line():
    """A checkpoint write on a full disk, or into a folder it may not write, is reported in
    its one-line error alone, with no traceback before it."""
    import errno

    from podrace.commands.train import explains_itself

    assert explains_itself(OSError(errno.ENOSPC, "No space left on device"))
    # a checkpoints folder made read-only during the run
    assert explains_itself(
        PermissionError(errno.EPERM, "Operation not permitted", "ck/1171.orbax-checkpoint-tmp")
    )
    assert explains_itself(
        ValueError("RESOURCE_EXHAUSTED: Error writing local file: No space left on device")
    )
    assert not explains_itself(ValueError("shapes do not match"))


@pytest.mark.timeout(60)
def test_ray_restart_limits_explain_themselves():
    """Ray's restart limits are reported in one line, with no traceback of podrace's own."""
    from podrace.commands.train import explains_itself
    from podrace.runtime.ray.workers import WorkerCrashLoop, WorkerNotReady

    assert explains_itself(
        WorkerCrashLoop("ray worker 0 failed 1 time, restart limit 0 (--ray.max-restarts)")
    )
    assert explains_itself(WorkerNotReady("restarted worker not ready within 20s"))


SIGNALLED_COMMAND = """
import os, signal, sys, time
from pathlib import Path
import podrace.commands.eval, podrace.metrics.plot
from podrace.commands.supervisor import signals_deferred

out = Path(sys.argv[2])

def signalled(*args):
    if sys.argv[3].startswith("while-writing"):
        with signals_deferred():
            os.kill(os.getpid(), getattr(signal, sys.argv[4]))
            if sys.argv[3] == "while-writing-twice":
                os.kill(os.getpid(), getattr(signal, sys.argv[4]))  # a second one: at once
            tmp = out.with_name("." + out.name + ".tmp")
            tmp.write_text("whole")
            time.sleep(0.5)  # a slow write: simulated work
            os.replace(tmp, out)
    else:
        os.kill(os.getpid(), getattr(signal, sys.argv[4]))
    time.sleep(60)  # a signal that does not end the command at once times the test out

podrace.commands.eval.evaluate_run = signalled
podrace.metrics.plot.plot_runs = signalled
from podrace.cli import main
from tests.waiting import wait_until
sys.exit(main([sys.argv[1], str(out.parent)] + (["-o", str(out)] if sys.argv[1] == "plot" else [])))
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", ["eval", "plot"])
@pytest.mark.parametrize(
    "when,signame",
    [
        ("at-once", "SIGINT"),
        ("at-once", "SIGTERM"),
        ("while-writing", "SIGINT"),
        ("while-writing-twice", "SIGINT"),
    ],
)
def test_a_signal_ends_eval_and_plot_at_once_in_one_line_after_any_output_write(
    tmp_path, command, when, signame
):
    """Ctrl-C or SIGTERM ends `podrace eval` and `podrace plot` at once with one line and
    exit 128 + the signal, wherever it lands (in one of JAX's callbacks, inside
    `import jax`): no traceback, no silent kill, no command that runs on. A write in
    progress finishes first, so no temp file is left; a second signal exits without it."""
    out = tmp_path / "out.png"
    done = subprocess.run(
        [sys.executable, "-c", SIGNALLED_COMMAND, command, str(out), when, signame],
        capture_output=True,
        text=True,
        timeout=50,
    )
    signum = getattr(signal, signame)
    assert done.returncode == 128 + signum, done.stderr
    if when == "while-writing-twice":  # the second one does not wait for the write
        assert done.stderr.strip().splitlines() == [f"podrace: second {signame}, exiting now"]
        return
    assert done.stderr.strip().splitlines() == [f"podrace: {signame} received, stopped"]
    assert sorted(p.name for p in tmp_path.iterdir()) == (
        ["out.png"] if when == "while-writing" else []
    )
    if when == "while-writing":
        assert out.read_text() == "whole"


ENTRY = """
import atexit, contextlib, os, signal, sys, time
import podrace.cli, podrace.metrics.plot
from podrace.config import ConfigError

when, signame = sys.argv[1], sys.argv[2]
sys.argv = ["podrace", "plot", "somewhere", "-o", "x.png"]

@contextlib.contextmanager
def signalled_before_the_command():
    os.kill(os.getpid(), getattr(signal, signame))
    time.sleep(30)  # a hang: the signal must end it
    yield

def fails(run_dirs, references=()):
    raise ConfigError("nothing to plot")

podrace.metrics.plot.plot_runs = fails
def slow_teardown():  # as JAX's, after Python removed its own signal handlers
    os.kill(os.getpid(), getattr(signal, signame))
    time.sleep(0.5)

if when == "before":
    podrace.cli.podrace_log_lines = signalled_before_the_command
atexit.register(slow_teardown)
sys.exit(podrace.cli.main())
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "when,signame,code,lines",
    [
        ("before", "SIGTERM", 143, ["podrace: SIGTERM received, stopped"]),
        ("after", "SIGINT", 2, ["podrace: error: nothing to plot"]),
        ("after", "SIGTERM", 2, ["podrace: error: nothing to plot"]),
    ],
)
def test_a_signal_around_a_command_ends_the_process_at_once(tmp_path, when, signame, code, lines):
    """A signal before the command's own handling ends the process with one line; one after
    the command finished, while the interpreter shuts down, leaves the command's own exit
    code (no silent kill, no KeyboardInterrupt in an atexit callback, no exit 0)."""
    done = subprocess.run(
        [sys.executable, "-c", ENTRY, when, signame],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == code, done.stderr
    assert done.stderr.strip().splitlines() == lines


LEAVING = """
import atexit, sys
import podrace.cli

class Finalized:
    def __del__(self):
        print("finalized", flush=True)

kept = Finalized()  # a module global: destroyed only by interpreter finalization
atexit.register(print, "atexit ran", flush=True)
sys.argv = ["podrace", "plot", "-o", "x.png"]
sys.exit(podrace.cli.main())
"""


@pytest.mark.timeout(60)
def test_the_command_ends_its_process_after_the_atexit_handlers_without_finalization(tmp_path):
    """Finalization took 0.6 s of a 6.5 s `podrace train`, tearing JAX down, and kills a
    thread left in native code, which can abort the process after the command succeeded."""
    done = subprocess.run(
        [sys.executable, "-c", LEAVING], cwd=tmp_path, capture_output=True, text=True, timeout=50
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout.splitlines() == ["atexit ran"], done.stdout
    # Started with stdout closed (`>&-`; sys.stdout is None): the same code and line, with no
    # AttributeError in the exit's flush.
    done = subprocess.run(
        f'"{sys.executable}" -c "$LEAVING" >&-',
        shell=True,
        cwd=tmp_path,
        text=True,
        env={**os.environ, "LEAVING": LEAVING},
        stderr=subprocess.PIPE,
        timeout=50,
    )
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "podrace: error: name at least one run directory to plot"
    ], done.stderr


def test_a_second_signal_removes_a_run_directory_that_never_trained(tmp_path):
    """A second Ctrl-C before the first update leaves no run directory holding only
    config.json (one --resume would refuse); a run that has trained keeps its directory."""
    from types import SimpleNamespace

    from podrace.commands.supervisor import Signals
    from podrace.commands.train import Training

    signals = Signals()
    training = Training([], signals)
    assert signals.before_exit == training.discard_untrained_run_dir
    for run, removed in (
        (None, True),
        (SimpleNamespace(learner=SimpleNamespace(version=0)), True),
        (SimpleNamespace(learner=SimpleNamespace(version=1)), False),
    ):
        run_dir = tmp_path / "r"
        run_dir.mkdir()
        (run_dir / "config.json").write_text("{}")
        training.lifetime, training.run = SimpleNamespace(run_dir=run_dir), run
        training.discard_untrained_run_dir()
        assert run_dir.exists() is not removed
        if run_dir.exists():
            (run_dir / "config.json").unlink()
            run_dir.rmdir()
    training.lifetime = SimpleNamespace(run_dir=None)  # a resumed run: its directory is not ours
    training.discard_untrained_run_dir()


@pytest.mark.timeout(60)
def test_podrace_warnings_are_podrace_lines_and_the_callers_logging_is_restored(
    capsys, monkeypatch, tmp_path
):
    """podrace's warnings are `podrace: warning:` lines even under a dependency's
    basicConfig (not `WARNING:podrace.evaluate:...`)."""
    import logging

    import podrace.metrics.plot

    def warns(run_dirs, references=()):
        logging.getLogger("podrace.metrics.plot").warning("run %s has no metrics", run_dirs[0])
        raise podrace.metrics.plot.ConfigError("nothing to plot")

    monkeypatch.setattr(podrace.metrics.plot, "plot_runs", warns)
    root = logging.getLogger()
    monkeypatch.setattr(
        root, "handlers", [logging.StreamHandler(sys.stderr)]
    )  # as basicConfig leaves it
    code, out, err = run_cli(capsys, "plot", str(tmp_path), "-o", str(tmp_path / "out.png"))
    assert code == 2
    assert err.splitlines() == [
        f"podrace: warning: run {tmp_path} has no metrics",
        "podrace: error: nothing to plot",
    ]
    podrace_logger = logging.getLogger("podrace")
    assert podrace_logger.propagate and not podrace_logger.handlers


def test_a_save_cut_by_the_exit_grace_is_named_in_the_one_stop_line(capsys):
    from types import SimpleNamespace

    from podrace.commands.supervisor import Signals
    from podrace.commands.train import Training

    signals = Signals()
    signals.received = signal.SIGTERM
    training = Training([], signals)
    training.run = SimpleNamespace(
        run_dir="runs/r", root="runs/r", checkpoints=SimpleNamespace(latest=3, writing=5)
    )
    assert training.stopped(left_behind=True) == 143
    assert capsys.readouterr().err.splitlines() == [
        "podrace: SIGTERM received, stopped; checkpoint 5 did not finish writing in time and is "
        "discarded; checkpoint 3 is the latest"
    ]
    training = Training([], signals)
    training.run = SimpleNamespace(
        run_dir="runs/r", root="runs/r", checkpoints=SimpleNamespace(latest=3, writing=None)
    )
    training.stopped()
    assert capsys.readouterr().err.splitlines() == [
        "podrace: SIGTERM received, stopped cleanly; checkpoint 3 saved "
        "(podrace train --resume runs/r)"
    ]


class _FillingDisk:
    """metrics.jsonl on a disk that fills up after `room` lines: a write then fails as the
    system's write does (the file is a real one, opened as JsonlSink opens it)."""

    room = 3

    @classmethod
    def open(cls, path, mode, buffering=-1):
        import io

        class File(io.FileIO):
            def write(self, data):
                if cls.room <= 0:
                    raise OSError(errno.ENOSPC, "No space left on device")
                cls.room -= 1
                return super().write(data)

        return File(path, mode)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_full_disk_under_the_metrics_and_the_last_checkpoint_is_one_line(
    capsys, tmp_path, monkeypatch
):
    """The metrics sink fails first, then the final save on the same full disk: the second
    failure was a `podrace: warning:` line ahead of the error; it is part of the one line."""
    import podrace.checkpoints.files
    import podrace.metrics.loggers

    def disk_full(step_dir):
        raise OSError(errno.ENOSPC, "No space left on device", str(step_dir / "manifest"))

    monkeypatch.setattr(podrace.metrics.loggers, "open", _FillingDisk.open, raising=False)
    monkeypatch.setattr(podrace.checkpoints.files, "write_manifest", disk_full)
    code, out, err = run_cli(
        capsys,
        "train",
        "cartpole-ppo",
        *run_flags(tmp_path, ENDLESS),
        "--log.console",
        "none",
        "--log.interval-s",
        "0.05",
    )
    run_dir = tmp_path / "r"
    assert code == 1 and len(err.splitlines()) == 1, err
    assert err.startswith(
        f"podrace: error: logger failed: SinkError: cannot write metrics to "
        f"{run_dir / 'metrics.jsonl'}: No space left on device; checkpoint "
    ), err
    assert f"could not be written in {run_dir / 'checkpoints'}: [Errno 28] No space left" in err
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 3
    assert list((run_dir / "checkpoints").iterdir()) == []  # the failed write gave its space back


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_directory_deleted_while_the_run_trains_ends_it_in_one_line(tmp_path):
    """The run went on training into the deleted directory (its metrics into the unlinked
    file), and its final save made a directory of that name again with only a checkpoint
    in it, which it then offered to resume."""
    import shutil

    run_dir = tmp_path / "r"
    proc = start_two_device_train(tmp_path)
    try:
        wait_until(
            lambda: (
                proc.poll() is not None
                or any(line.get("version", 0) >= 1 for line in metric_lines(run_dir))
            ),
            timeout=240,
        )
        shutil.rmtree(run_dir)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 1 and len(err.splitlines()) == 1, err
    assert err.startswith(
        f"podrace: error: logger failed: SinkError: cannot write metrics to "
        f"{run_dir / 'metrics.jsonl'}: the file was deleted, with the run directory; "
        f"checkpoint "
    ), err
    assert err.rstrip().endswith(f"cannot be written: the run directory {run_dir} was deleted")
    assert not run_dir.exists()
