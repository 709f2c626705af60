"""Checkpoints during training and `--resume` (thread runtime, Python API).

CLI cases (exit codes, signals, SIGKILL during a write) are in tests/commands/test_train_resume.py.
"""

from __future__ import annotations

import json
import re
import shutil

import gymnasium as gym
import jax
import numpy as np
import pytest

from podrace.checkpoints.read import restore
from podrace.checkpoints.resume import (
    SUPERSEDED,
    Resume,
    ResumePoint,
    check_changes,
    commit,
    run_config_json,
    split_metrics,
)
from podrace.checkpoints.state import abstract_run_state, checkpoint_dir
from podrace.checkpoints.steps import checkpoint_steps
from podrace.config import ConfigError, replace
from podrace.envs import env_spec
from podrace.runtime.run import prepare
from tests.helpers.checkpoints import fake_run, flip_a_byte, metrics_line, snapshot
from tests.helpers.configs import small
from tests.helpers.runs import metric_lines, stop_after
from tests.runtime.topologies import TOPOLOGIES, every_topology
from tests.waiting import wait_until

N = 3
"""Updates before the stop; the straight run does 2N."""


def leaves_equal(a, b) -> bool:
    la, lb = jax.tree.leaves(jax.device_get(a)), jax.tree.leaves(jax.device_get(b))
    return len(la) == len(lb) and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb)
    )


def record_learning_rates(run) -> list[float]:
    """The learning rate each update used (mean over its minibatches), in update order."""
    rates = []
    update_fn = run.learner.update_fn

    def recording(state, trajs, keys):
        state, keys, metrics = update_fn(state, trajs, keys)
        rates.append(float(jax.device_get(metrics["learning_rate"])))
        return state, keys, metrics

    run.learner.update_fn = recording
    return rates


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_stop_and_resume_continues_the_straight_run(tmp_path):
    """Deterministic mode, same seed: N updates, stop, resume to 2N, against a straight 2N run.

    What can be equal is checked to be bit-identical: the state saved when the run is
    stopped at N equals the straight run's checkpoint at N (params, optimizer state, step,
    learner and actor keys, counters), and the resumed learner starts from exactly that.
    What cannot: envpool's env state is not checkpointable, so the resumed run restarts its
    envs (with seeds that fold in N) and its rollouts, hence its params after 2N, differ
    from the straight run's. After the resumed training the things that do not depend on
    the data are compared instead: the learning rate of every update (the optimizer's step
    count was restored, so the schedule continues), step counters, versions, env steps.
    A second resume from a copy of the same checkpoint must reproduce the first one bit for
    bit (the restart is deterministic).
    """
    spu = 2 * 8 * 16
    base = {
        "deterministic": True,
        "total_steps": 2 * N * spu,
        "normalize.obs": True,
        "normalize.reward": True,
    }
    straight = prepare(
        small(tmp_path, **base, **{"log.run_name": "b", "checkpoint.every_updates": N})
    )
    straight_rates = record_learning_rates(straight)
    straight.run()
    assert checkpoint_steps(checkpoint_dir(straight.run_dir)) == [N, 2 * N]

    stopped = prepare(small(tmp_path, **base, **{"log.run_name": "a"}))  # saves only at the end
    stop_after(stopped, N)
    result = stopped.run()
    assert (result.updates, result.checkpoint) == (N, N)
    spec = env_spec(stopped.cfg.env)
    like = abstract_run_state(stopped.cfg, spec)
    saved = restore(checkpoint_dir(stopped.run_dir), like, spec, N)
    reference = restore(checkpoint_dir(straight.run_dir), like, spec, N)
    assert leaves_equal(saved.arrays(), reference.arrays())
    assert (
        (saved.version, saved.env_steps, saved.episodes, saved.actor_next_seq)
        == (reference.version, reference.env_steps, reference.episodes, reference.actor_next_seq)
        == (N, N * spu, reference.episodes, (N, N))
    )
    shutil.copytree(tmp_path / "a", tmp_path / "a-copy")

    resumed = prepare(None, resume=Resume(tmp_path / "a"))
    assert leaves_equal(resumed.learner.state, saved.train_state)
    assert leaves_equal(resumed.learner.keys, saved.learner_keys)
    # Statistics continue; each env's discounted return starts again with its restarted env.
    normalizer = resumed.learner.normalizer
    assert leaves_equal(normalizer._replace(tracker=None), saved.normalizer._replace(tracker=None))
    assert np.any(np.asarray(saved.normalizer.tracker.returns)) and not np.any(
        np.asarray(normalizer.tracker.returns)
    )
    assert resumed.learner.version == N and resumed.publisher.metrics()["latest_version"] == N
    for actor, key in zip(resumed.actors, saved.actor_keys):
        assert actor.settings.first_seq == N
        np.testing.assert_array_equal(
            np.asarray(actor.settings.key), np.asarray(jax.random.fold_in(key, N))
        )
    resumed_rates = record_learning_rates(resumed)
    result = resumed.run()

    assert (result.updates, result.checkpoint, result.env_steps) == (2 * N, 2 * N, 2 * N * spu)
    assert resumed_rates == straight_rates[N:]  # exact: same optimizer step counts, same schedule
    final, reference_final = resumed.learner.state, straight.learner.state
    assert int(final.step) == int(reference_final.step) == 2 * N
    counts = [
        x
        for x in jax.tree.leaves(jax.device_get(final.opt_state))
        if np.issubdtype(x.dtype, np.integer)
    ]
    reference_counts = [
        x
        for x in jax.tree.leaves(jax.device_get(reference_final.opt_state))
        if np.issubdtype(x.dtype, np.integer)
    ]
    assert counts and leaves_equal(counts, reference_counts)
    assert checkpoint_steps(checkpoint_dir(tmp_path / "a")) == [N, 2 * N]

    lines = metric_lines(tmp_path / "a")
    assert [line.get("final") for line in lines].count(1) == 2  # one per segment
    for key in ("version", "env_steps", "time_s", "episodes"):
        values = [line.get(key, 0) for line in lines]
        assert values == sorted(values), key
    assert lines[-1]["version"] == 2 * N and lines[-1]["env_steps"] == 2 * N * spu
    assert json.loads((tmp_path / "a" / "config.json").read_text())["total_steps"] == 2 * N * spu

    again = prepare(None, resume=Resume(tmp_path / "a-copy"))
    again.run()
    assert leaves_equal(again.learner.state, resumed.learner.state)
    assert not leaves_equal(
        resumed.learner.state.params, straight.learner.state.params
    )  # envs did restart


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_resume_can_extend_a_finished_run_and_refuses_other_changes(tmp_path):
    cfg = small(tmp_path, total_steps=2 * 8 * 16 * 2, **{"log.run_name": "r"})
    first = prepare(cfg)
    first.run()
    stored = first.cfg
    before = snapshot(tmp_path / "r")
    with pytest.raises(
        ConfigError, match="nothing to resume: checkpoint 2 is already at update 2 of 2"
    ):
        prepare(None, resume=Resume(tmp_path / "r"))
    with pytest.raises(ConfigError, match=r"--resume cannot change network.hidden_sizes"):
        prepare(
            replace(stored, total_steps=2 * 8 * 16 * 4, **{"network.hidden_sizes": (8,)}),
            resume=Resume(tmp_path / "r"),
        )
    assert snapshot(tmp_path / "r") == before

    result = prepare(
        replace(stored, total_steps=2 * 8 * 16 * 3), resume=Resume(tmp_path / "r")
    ).run()
    assert (result.updates, result.checkpoint) == (3, 3)
    assert checkpoint_steps(checkpoint_dir(tmp_path / "r")) == [2, 3]


# Decisions about what a resumed run may change, and about metrics -------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "change,allowed",
    [
        ({"total_steps": 10**6}, True),
        (
            {
                "checkpoint.every_updates": 7,
                "eval.episodes": 3,
                "log.console": "lines",
                "safety.watchdog_s": 5.0,
            },
            True,
        ),
        ({"network.hidden_sizes": (8,)}, False),
        ({"env.num_envs": 4}, False),
        ({"ppo.learning_rate": 1e-3}, False),
        ({"seed": 2}, False),
        ({"layout.actors_per_device": 1}, False),
        ({"log.run_name": "other"}, False),
    ],
)
def test_which_changes_a_resume_allows(change, allowed):
    stored = small("runs", total_steps=2 * 8 * 16 * 4)
    if allowed:
        check_changes(stored, replace(stored, **change), step=2)
    else:
        with pytest.raises(ConfigError, match=f"--resume cannot change {next(iter(change))} "):
            check_changes(stored, replace(stored, **change), step=2)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("waited", [True, False], ids=["waited-for", "not-waited-for"])
def test_the_final_metrics_line_names_the_final_checkpoint(tmp_path, monkeypatch, waited):
    """The final line waits for the final checkpoint's write (up to FINAL_SAVE_WAIT_S), so
    its `checkpoint/version` names that checkpoint, not the one before. A write that does
    not end in time is not waited for (a signal then leaves too little time): the line
    names the one before, and the write still completes."""
    from podrace.checkpoints.files import Checkpointer

    write = Checkpointer._write
    metrics = tmp_path / "r" / "metrics.jsonl"

    def write_after_the_final_line(self, step, *rest):
        if step == 12:  # the final save ends only once the final line is out
            wait_until(lambda: metrics.exists() and '"final": 1' in metrics.read_text(), 60)
        write(self, step, *rest)

    if waited:
        monkeypatch.setattr("podrace.runtime.skeleton.FINAL_SAVE_WAIT_S", 60.0)
    else:
        monkeypatch.setattr("podrace.runtime.skeleton.FINAL_SAVE_WAIT_S", 0.0)
        monkeypatch.setattr(Checkpointer, "_write", write_after_the_final_line)
    run = prepare(small(tmp_path, **{"log.run_name": "r", "checkpoint.every_updates": 5}))
    result = run.run()
    steps = checkpoint_steps(checkpoint_dir(result.run_dir))
    assert steps[-1] == result.updates == result.checkpoint == 12
    last = json.loads(metrics.read_text().splitlines()[-1])
    assert last["final"] == 1 and last["checkpoint/version"] == (12 if waited else 10)


@pytest.mark.timeout(30)
def test_metric_lines_after_the_checkpoint_are_superseded_not_lost(tmp_path):
    lines = [
        json.dumps({"time_s": 0.1}),  # before the first update: no version yet
        metrics_line(1, 10, 0.5),
        metrics_line(2, 10, 1.0),
        metrics_line(2, 20, 1.5),
        metrics_line(3, 30, 2.0, final=1),
        '{"version": 3, "env_st',  # cut by a kill
    ]
    kept, superseded = split_metrics(lines, version=2, env_steps=20)
    assert kept == lines[:4] and superseded == lines[4:]
    too_deep = "[" * 100_000 + "]" * 100_000  # json raises RecursionError, not a ValueError
    assert split_metrics(lines[:2] + [too_deep], version=2, env_steps=20) == (lines[:2], [too_deep])

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    stored = small(tmp_path, **{"log.run_name": "run"})
    p = ResumePoint(run_dir, 2, stored, stored)
    assert commit(p, 2, 20, stored, p.run_dir) == 1.5
    assert (run_dir / "metrics.jsonl").read_text().splitlines() == lines[:4]
    assert (run_dir / SUPERSEDED).read_text().splitlines() == lines[4:]
    assert (
        commit(p, 2, 20, stored, p.run_dir) == 1.5
    )  # idempotent: resuming the same checkpoint again
    assert (run_dir / SUPERSEDED).read_text().splitlines() == lines[4:]
    assert json.loads((run_dir / "config.json").read_text())["log"]["run_name"] == "run"


# Errors a resume reports before touching anything ------------------------------------------


class Obs(gym.Env):
    """A Gymnasium env whose observation size the test changes between save and resume."""

    size = 4

    def __init__(self, **kwargs):
        self.observation_space = gym.spaces.Box(-1, 1, (Obs.size,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.zeros(Obs.size, np.float32), {}

    def step(self, action):
        return np.zeros(Obs.size, np.float32), 0.0, False, False, {}


@pytest.mark.timeout(120)
def test_a_checkpoint_whose_env_spaces_differ_is_refused_and_nothing_changes(tmp_path):
    gym.register("PodraceResumeObs-v0", entry_point=Obs)
    try:
        cfg = small(
            tmp_path,
            **{"env.id": "PodraceResumeObs-v0", "log.run_name": "r", "network.hidden_sizes": (8,)},
        )
        run_dir = fake_run(tmp_path, cfg)
        before = snapshot(run_dir)
        Obs.size = 5
        with pytest.raises(
            ConfigError,
            match=r"saved for env 'PodraceResumeObs-v0' with obs_shape \[4\], "
            r"the config's env has \[5\]",
        ):
            prepare(None, resume=Resume(run_dir))
        assert snapshot(run_dir) == before
    finally:
        Obs.size = 4
        gym.envs.registration.registry.pop("PodraceResumeObs-v0", None)


@pytest.mark.timeout(120)
@every_topology
def test_resume_errors_name_the_problem_and_change_nothing(tmp_path, topology):
    changes = {"log.run_name": "r", "network.hidden_sizes": (8,), **TOPOLOGIES[topology]}
    cfg = small(tmp_path, **changes)
    run_dir = fake_run(tmp_path, cfg, versions=(1, 2))
    before = snapshot(run_dir)
    cases = [
        (Resume(tmp_path / "missing"), "not a directory"),
        (Resume(tmp_path), r"not a podrace run directory \(no config.json\)"),
        (Resume(run_dir, 5), "saved steps are 1, 2"),
        (Resume(run_dir, 1), r"checkpoint\(s\) 2 come after it and would be replaced"),
        (
            Resume(run_dir, 1, step_was_latest=True),
            r"its checkpoints changed while this command started \(checkpoint 1 "
            r"was the latest, now 2 is: another podrace process wrote it\); run the command again",
        ),
        (
            Resume(run_dir, 0, step_was_latest=True),
            r"checkpoint 0 was the latest, now 2 is",
        ),  # 0 rotated away
    ]
    for resume, message in cases:
        with pytest.raises(ConfigError, match=message):
            prepare(None, resume=resume)
    empty = fake_run(tmp_path, replace(cfg, **{"log.run_name": "empty"}), versions=())
    with pytest.raises(ConfigError, match="has no checkpoint"):
        prepare(None, resume=Resume(empty))
    (empty / "checkpoints").write_text("")  # no checkpoint yet, and a file in the way
    with pytest.raises(
        ConfigError, match=f"cannot resume {empty}: {empty / 'checkpoints'} is not a directory"
    ):
        prepare(None, resume=Resume(empty))
    array_file = flip_a_byte(run_dir / "checkpoints" / "2")
    before[array_file] = array_file.read_bytes()
    with pytest.raises(
        ConfigError,
        match=re.escape(f"corrupt checkpoint: {array_file} differs from what was written"),
    ):
        prepare(None, resume=Resume(run_dir))
    assert snapshot(run_dir) == before


@pytest.mark.timeout(30)
def test_a_full_disk_while_updating_the_run_directory_leaves_no_temp_file(tmp_path):
    """config.json's replacement is written to a temp file first; here that write hits a full
    disk (the temp name points at /dev/full). The error is one line, config.json is as it
    was, and the temp file is gone."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text("{}\n")
    (run_dir / "metrics.jsonl").write_text(metrics_line(1, 10, 0.5) + "\n")
    tmp = run_dir / ".config.json.resume-tmp"
    tmp.symlink_to("/dev/full")
    stored = small(tmp_path, **{"log.run_name": "run"})
    with pytest.raises(
        ConfigError,
        match=rf"^cannot update {re.escape(str(run_dir))} for the resumed run: "
        r"No space left on device$",
    ):
        commit(ResumePoint(run_dir, 2, stored, stored), 2, 20, stored, run_dir)
    assert not tmp.is_symlink() and not tmp.exists()
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.json", "metrics.jsonl"]
    assert (run_dir / "config.json").read_text() == "{}\n"


@pytest.mark.timeout(30)
def test_a_config_json_nested_too_deeply_is_unreadable_not_a_crash(tmp_path):
    (tmp_path / "config.json").write_text('{"algo": ' * 100_000 + "1" + "}" * 100_000)
    assert run_config_json(tmp_path) is None


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_stop_while_a_resumed_run_is_built_is_a_stop_and_changes_nothing(tmp_path, monkeypatch):
    """A stop during a resume's start-up that closes the publisher before the evaluator
    subscribed is a stop, as in a fresh run: Stopped, not ChannelClosed (a traceback, exit
    1)."""
    from podrace.control import Lifetime, Stopped
    from podrace.runtime.run import Run

    cfg = small(
        tmp_path,
        **{"log.run_name": "r", "network.hidden_sizes": (8,), "layout.actors_per_device": 1},
    )
    run_dir = fake_run(tmp_path, cfg)
    before = snapshot(run_dir)
    lifetime = Lifetime()
    monkeypatch.setattr(Run, "_build_evaluator", _stop_before_the_evaluator(lifetime))
    with pytest.raises(Stopped):
        prepare(None, lifetime, resume=Resume(run_dir))
    assert snapshot(run_dir) == before


def _stop_before_the_evaluator(lifetime):
    """_build_evaluator with the stop landing after its last check, as the evaluator
    subscribes."""
    from podrace.runtime.run import Run

    original = Run._build_evaluator

    def build(self):
        subscribe = self.publisher.subscribe

        def stopped_then_subscribe(*args, **kwargs):
            if kwargs.get("name") == "evaluator":
                lifetime.stop("SIGINT received")
            return subscribe(*args, **kwargs)

        self.publisher.subscribe = stopped_then_subscribe
        return original(self)

    return build
