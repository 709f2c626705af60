"""`podrace train --resume`: errors (exit 2, one line, nothing changed), a run stopped by
SIGINT continues from the checkpoint it wrote, a run killed during a checkpoint write
continues from the previous one."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from pathlib import Path

import pytest

from podrace.checkpoints.read import read_config, read_meta
from podrace.checkpoints.resume import SUPERSEDED
from podrace.checkpoints.state import checkpoint_dir
from podrace.checkpoints.steps import checkpoint_steps
from podrace.config import ConfigError, replace
from tests.envs.user_envs import CONSTANT_RETURN, constant_envs
from tests.helpers.checkpoints import fake_run, flip_a_byte, snapshot
from tests.helpers.cli import (
    ENDLESS,
    EXIT_SLACK_S,
    REPO,
    TWO_DEVICE_FLAGS,
    run_cli,
    run_flags,
    start_podrace,
    start_two_device_train,
)
from tests.helpers.configs import SMALL_SPU, small
from tests.helpers.runs import factory_run, metric_lines
from tests.runtime.topologies import TOPOLOGIES, every_topology
from tests.waiting import wait_until

SPU = 64 * 8  # cartpole-ppo: env steps per update


@pytest.mark.timeout(120)
@every_topology
def test_resume_errors_are_one_line_exit_2_and_change_nothing(capsys, tmp_path, topology):
    changes = TOPOLOGIES[topology]
    run_dir = fake_run(
        tmp_path,
        small(tmp_path, **{"log.run_name": "r", "network.hidden_sizes": (8,), **changes}),
    )
    no_checkpoint = fake_run(
        tmp_path, small(tmp_path, **{"log.run_name": "empty", **changes}), versions=()
    )
    before = snapshot(tmp_path)
    cases = [
        (["--resume", str(tmp_path / "nope")], "not a directory"),
        (["--resume", str(tmp_path)], "not a podrace run directory (no config.json)"),
        (["--resume", str(no_checkpoint)], "has no checkpoint"),
        (["--resume", str(run_dir), "--resume-from", "7"], "saved steps are 2"),
        (
            ["--resume", str(run_dir), "--network.hidden-sizes", "16"],
            "--resume cannot change network.hidden_sizes",
        ),
        (["--resume", str(run_dir), "--env.id", "Acrobot-v1"], "--resume cannot change env.id"),
        (
            ["--resume", str(run_dir), "--total-steps", "512"],
            "nothing to resume: checkpoint 2 is already at update 2",
        ),
        (["--resume", str(run_dir), "cartpole-ppo"], "drop 'cartpole-ppo'"),
        (["--resume-from", "2", "cartpole-ppo"], "--resume-from needs --resume RUN_DIR"),
        (
            ["--resume", str(run_dir), "--resume-from", "x"],
            "--resume-from must be a checkpoint step",
        ),
        (
            ["--resume", str(run_dir), "--resume-from", "\u00b2"],
            "--resume-from must be a checkpoint step",
        ),
        (["--resume", ""], "--resume needs a value, got ''"),
        (["--resume=", "--total-steps", "100"], "--resume needs a value"),
    ]
    for args, message in cases:
        code, out, err = run_cli(capsys, "train", *args)
        assert code == 2, (args, err)
        assert err.strip() == err.strip().splitlines()[0] and message in err, (args, err)
    in_the_way = (
        run_dir / "checkpoints" / "3.partial"
    )  # where the resumed run would write its next step
    in_the_way.write_text("")
    code, out, err = run_cli(capsys, "train", "--resume", str(run_dir), "--total-steps", "100000")
    assert (
        code == 2
        and err.strip()
        == f"podrace: error: {in_the_way} is in the way of podrace's checkpoints "
        "(a step is written as <step>.partial and deleted as <step>.deleting); "
        f"move it out of {in_the_way.parent}"
    ), err
    in_the_way.unlink()
    array_file = flip_a_byte(run_dir / "checkpoints" / "2")
    before[array_file] = array_file.read_bytes()
    code, out, err = run_cli(capsys, "train", "--resume", str(run_dir), "--total-steps", "100000")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert (
        f"corrupt checkpoint: {array_file} differs from what was written (SHA-256 mismatch)" in err
    )
    assert snapshot(tmp_path) == before


@pytest.mark.timeout(120)
def test_an_elastic_ray_run_resumes_only_with_its_order_and_batch(capsys, tmp_path):
    """The data order, the worker count and the rollouts per update set what an update
    takes and how the learner's env columns are filled: a resume keeps the checkpoint's, and
    refuses another in one line (exit 2) before any Ray starts."""
    elastic = {"runtime": "ray", "ray.num_workers": 2, "ray.data_order": "elastic"}
    run_dir = fake_run(tmp_path, small(tmp_path, **{"log.run_name": "r", **elastic}))
    before = snapshot(tmp_path)
    for args, message in [
        (["--ray.num-workers", "3"], "--resume cannot change ray.num_workers"),
        (["--ray.data-order", "fixed"], "--resume cannot change ray.data_order"),
        (["--ray.rollouts-per-update", "4"], "--resume cannot change ray.rollouts_per_update"),
    ]:
        code, out, err = run_cli(capsys, "train", "--resume", str(run_dir), *args)
        assert code == 2, (args, err)
        assert err.strip() == err.strip().splitlines()[0] and message in err, (args, err)
    assert snapshot(tmp_path) == before


@pytest.mark.timeout(120)
def test_a_resume_from_a_renamed_step_folder_is_refused_and_changes_nothing(capsys, tmp_path):
    """checkpoints/2 renamed to checkpoints/5: resuming it would continue update 2 while its
    later steps and counters said 5."""
    run_dir = fake_run(
        tmp_path, small(tmp_path, **{"log.run_name": "r", "network.hidden_sizes": (8,)})
    )
    os.rename(run_dir / "checkpoints" / "2", run_dir / "checkpoints" / "5")
    before = snapshot(tmp_path)
    for pick in (["--resume-from", "5"], []):
        code, out, err = run_cli(
            capsys, "train", "--resume", str(run_dir), *pick, "--total-steps", "100000"
        )
        assert code == 2 and err.splitlines() == [
            f"podrace: error: corrupt checkpoint: {run_dir / 'checkpoints' / '5' / 'meta'}: it "
            "holds update 2, but its folder is named 5 (a step folder must keep the name it was "
            "written with)"
        ], err
    assert snapshot(tmp_path) == before


@pytest.mark.timeout(120)
def test_the_cli_pins_the_latest_step_and_says_so(tmp_path):
    """A resume reads the config before it holds the run: if another resume of the run ends
    in between, the refusal must say so, not name a step the user never chose."""
    from podrace.checkpoints.resume import Resume
    from podrace.commands.train import parse_resumed

    run_dir = fake_run(tmp_path, small(tmp_path, **{"log.run_name": "r"}), versions=(1, 2))
    assert parse_resumed(str(run_dir), None, ["--total-steps", "100000"])[0] == Resume(
        run_dir, 2, step_was_latest=True
    )
    assert parse_resumed(str(run_dir), 2, ["--total-steps", "100000"])[0] == Resume(run_dir, 2)


@pytest.mark.timeout(120)
def test_a_resume_of_a_run_still_writing_is_in_use_before_its_checkpoints_are_read(
    tmp_path, monkeypatch
):
    """A live run rotates its checkpoints: read before the lock, the latest could vanish
    mid-read and be reported as corrupt."""
    import podrace.checkpoints.resume
    from podrace.commands.train import parse_resumed
    from podrace.rundir import RunLock

    run_dir = fake_run(tmp_path, small(tmp_path, **{"log.run_name": "r"}), versions=(1, 2))
    monkeypatch.setattr(
        podrace.checkpoints.resume, "stored_config", lambda resume: pytest.fail("read while in use")
    )
    lock = RunLock(run_dir)
    try:
        with pytest.raises(
            ConfigError, match=f"run directory {run_dir} is in use by another podrace process"
        ):
            parse_resumed(str(run_dir), None, [])
    finally:
        lock.release()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_trained_with_an_env_factory_resumes_from_the_cli_on_that_factorys_envs(
    capsys, tmp_path
):
    """The run records `module:qualname` of its factory; `--resume` imports it, where it
    played CartPole (the config's unused id) before."""
    run_dir = factory_run(tmp_path, constant_envs)
    code, out, err = run_cli(
        capsys, "train", "--resume", str(run_dir), "--total-steps", str(4 * SMALL_SPU)
    )
    assert code == 0, err
    lines = metric_lines(run_dir)
    assert lines[-1]["version"] == 4 and lines[-1]["eval/return"] == CONSTANT_RETURN, lines[-1]
    played = {line["episode/return"] for line in lines if "episode/return" in line}
    assert played == {CONSTANT_RETURN}, played
    step, meta = read_meta(checkpoint_dir(run_dir))
    assert step == 4 and meta["env_factory"] == {
        "name": "constant_envs",
        "import": "tests.envs.user_envs:constant_envs",
    }


@pytest.mark.timeout(300)
def test_a_run_of_an_env_factory_no_command_can_import_is_refused_with_how_to_continue(
    capsys, tmp_path
):
    """A factory defined inside a function (or in a script run as __main__) cannot be
    imported by a command: the resume is refused in one line, nothing changes, and the way
    the line names, from Python with the same factory, continues the run."""
    from podrace.checkpoints.resume import Resume
    from podrace.envs import EnvSource
    from podrace.runtime.run import train as train_threads

    def local_envs(num_envs, seed):
        return constant_envs(num_envs, seed)

    run_dir = factory_run(tmp_path, local_envs)
    before = snapshot(run_dir)
    code, out, err = run_cli(
        capsys, "train", "--resume", str(run_dir), "--total-steps", str(4 * SMALL_SPU)
    )
    name = local_envs.__qualname__
    assert code == 2 and err.splitlines() == [
        f"podrace: error: cannot resume {run_dir}: its envs came from the env factory {name!r}, "
        "which podrace cannot import (only a function or class defined at the top level of an "
        "importable module can be, not one defined inside a function or in a script run as "
        "__main__); continue the run from Python with the same factory: "
        "podrace.runtime.run.train(None, envs=podrace.envs.EnvSource(cfg.env, factory), "
        f"resume=podrace.checkpoints.resume.Resume({str(run_dir)!r}))"
    ], err
    assert snapshot(run_dir) == before

    cfg = replace(read_config(checkpoint_dir(run_dir))[1], total_steps=4 * SMALL_SPU)
    result = train_threads(cfg, envs=EnvSource(cfg.env, local_envs), resume=Resume(run_dir))
    assert result.updates == 4 and result.final_eval.mean_return == CONSTANT_RETURN


def assert_continuous(lines: list[dict], checkpoint: int, total_updates: int) -> None:
    """One stream: versions, env steps, episodes and time never go back; it reaches the end."""
    for key in ("version", "env_steps", "episodes", "time_s"):
        values = [line.get(key, 0) for line in lines]
        assert values == sorted(values), (key, values)
    finals = [line for line in lines if line.get("final")]
    assert len(finals) == 2 and finals[0]["version"] <= checkpoint
    assert lines[-1]["version"] == total_updates and lines[-1]["env_steps"] == total_updates * SPU


def resume_to(run_dir: Path, updates: int) -> str:
    proc = start_podrace(
        "train",
        "--resume",
        str(run_dir),
        "--total-steps",
        str(updates * SPU),
        "--log.console",
        "none",
        device_count=False,
        cwd=REPO,
    )
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert f"checkpoint: update {updates}" in out
    return out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigint_saves_a_checkpoint_that_resume_continues(tmp_path):
    run_dir = tmp_path / "r"
    proc = start_two_device_train(tmp_path)
    try:
        wait_until(
            lambda: any(line.get("version", 0) >= 3 for line in metric_lines(run_dir)),
            240,
            while_alive=proc,
        )
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        exit_s = time.monotonic() - sent
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, err
    assert exit_s <= EXIT_SLACK_S, exit_s  # the save fits in the CLI's exit grace
    (step,) = checkpoint_steps(
        checkpoint_dir(run_dir)
    )  # checkpoint.every_updates 0: the stop saved it
    assert f"checkpoint {step} saved" in err and step >= 3
    assert metric_lines(run_dir)[-1]["version"] == step  # the final line and the checkpoint agree

    resume_to(run_dir, step + 2)
    assert checkpoint_steps(checkpoint_dir(run_dir)) == [step, step + 2]
    assert_continuous(metric_lines(run_dir), step, step + 2)
    assert read_meta(checkpoint_dir(run_dir))[1]["config"]["layout"]["actor_device_ids"] == [1]


KILLED_DURING_WRITE = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from orbax.checkpoint._src.path import atomicity
    from podrace.cli import main

    marker, checkpoints = Path(sys.argv[1]), Path(sys.argv[2])

    def slowed(cls):
        finalize = cls.finalize

        async def slow_finalize(self, *args, **kwargs):
            # Every file of this save is written, nothing committed: the worst moment to die.
            if checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir()):
                marker.write_text("writing")
                time.sleep(600)
            return await finalize(self, *args, **kwargs)

        cls.finalize = slow_finalize

    for cls in (atomicity.AtomicRenameTemporaryPath, atomicity.CommitFileTemporaryPath):
        slowed(cls)
    sys.exit(main(sys.argv[3:]))
    """
)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigkill_during_a_checkpoint_write_then_resume(tmp_path):
    run_dir, marker = tmp_path / "r", tmp_path / "marker"
    proc = start_podrace(
        str(marker),
        str(checkpoint_dir(run_dir)),
        "train",
        "cartpole-ppo",
        *run_flags(tmp_path, ENDLESS),
        "--checkpoint.every-updates",
        "2",
        *TWO_DEVICE_FLAGS,
        script=KILLED_DURING_WRITE,
        device_count=False,
        cwd=REPO,
    )
    try:
        wait_until(marker.exists, 240, while_alive=proc)  # checkpoint 4 is being written
        # The learner runs on past it (to 6, where it waits for that write): a metrics line
        # past 4 is written while the write is in progress.
        wait_until(
            lambda: any(line.get("version", 0) > 4 for line in metric_lines(run_dir)),
            240,
            while_alive=proc,
        )
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
        proc.wait()
    assert checkpoint_steps(checkpoint_dir(run_dir)) == [2]
    assert [p for p in checkpoint_dir(run_dir).iterdir() if not p.name.isdigit()], (
        "a write was in progress"
    )
    beyond = [line for line in metric_lines(run_dir) if line.get("version", 0) > 2]

    resume_to(run_dir, 5)
    assert checkpoint_steps(checkpoint_dir(run_dir)) == [2, 4, 5]
    assert [
        p.name for p in checkpoint_dir(run_dir).iterdir() if not p.name.isdigit()
    ] == []  # leftovers cleaned
    lines = metric_lines(run_dir)
    for key in ("version", "env_steps", "time_s"):
        assert [line.get(key, 0) for line in lines] == sorted(line.get(key, 0) for line in lines), (
            key
        )
    assert lines[-1]["version"] == 5 and lines[-1]["final"] == 1
    superseded = (run_dir / SUPERSEDED).read_text().splitlines() if beyond else []
    assert [json.loads(t) for t in superseded] == beyond
