"""`podrace eval`: loads a checkpoint, plays fresh episodes, writes JSON and a video."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from pathlib import Path

import gymnasium
import jax
import numpy as np
import pytest
from PIL import Image

import podrace.checkpoints.read
import podrace.commands.eval
from podrace.checkpoints.files import Checkpointer
from podrace.checkpoints.state import RunState, checkpoint_dir
from podrace.checkpoints.steps import checkpoint_steps, latest_step
from podrace.commands.eval import EvalOptions, evaluate_run, summary
from podrace.commands.playing import play_episodes
from podrace.config import ConfigError
from podrace.envs import env_spec, make_env
from tests.envs.user_envs import CONSTANT_RETURN, MatchEnv, NoFrames, constant_envs
from tests.helpers.actors import FixedLengthEnv
from tests.helpers.checkpoints import fresh_state, save_versions
from tests.helpers.cli import run_podrace
from tests.helpers.configs import tiny_config


def module_in_the_working_directory(tmp_path, monkeypatch, name: str, source: str) -> None:
    """`source` as module `name` in `tmp_path`, the working directory for the test and first
    on sys.path, as for `python` started there."""
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        sys, "path", [str(tmp_path)] + [p for p in sys.path if p not in ("", str(tmp_path))]
    )


def always_right(state: RunState) -> RunState:
    """Params whose most likely action is 1 (push right) in every state."""
    params = jax.tree.map(np.asarray, state.train_state.params)
    head = params["params"]["policy_head"]
    head["kernel"] = np.zeros_like(head["kernel"])
    head["bias"] = np.asarray([0.0, 5.0], np.float32)
    return dataclasses.replace(state, train_state=state.train_state._replace(params=params))


def make_run(run_dir: Path, state_fn=lambda s: s, cfg=None) -> Path:
    cfg = tiny_config() if cfg is None else cfg
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg)))
    checkpointer = Checkpointer(checkpoint_dir(run_dir), cfg, env_spec(cfg.env))
    try:
        checkpointer.save(state_fn(fresh_state(cfg, version=3)))
    finally:
        checkpointer.close()
    return run_dir


@pytest.mark.timeout(120)
def test_eval_plays_the_checkpoint_policy_and_writes_json_without_overwriting(tmp_path):
    run = make_run(tmp_path / "run", always_right)
    result = evaluate_run(EvalOptions(run, episodes=6, seed=4))

    written = json.loads((run / "eval-3.json").read_text())
    assert (
        written["checkpoint"] == 3
        and written["episodes"] == 6
        and written["policy"] == "deterministic"
    )
    returns = np.asarray(written["returns"])
    assert written["return"] == pytest.approx(
        {"mean": returns.mean(), "std": returns.std(), "min": returns.min(), "max": returns.max()}
    )
    assert set(written["length"]) == {"mean", "std", "min", "max"} and len(written["lengths"]) == 6

    # The same envs driven by "always push right" give exactly these episodes.
    env = make_env(tiny_config().env, 6, 4)
    expected, _ = play_episodes(env, lambda obs: np.ones(len(obs), np.int32), 6).result()
    env.close()
    assert written["returns"] == expected.tolist()

    again = evaluate_run(EvalOptions(run, episodes=6, seed=4))
    assert again["output"] == str(run / "eval-3-2.json")
    assert json.loads((run / "eval-3.json").read_text()) == written
    assert result["output"] == str(run / "eval-3.json")


@pytest.mark.timeout(30)
def test_every_env_plays_its_share_so_short_episodes_are_not_over_counted():
    returns, lengths = play_episodes(
        FixedLengthEnv([1, 10]), lambda obs: np.zeros(len(obs), int), 4
    ).result()
    assert sorted(lengths.tolist()) == [1, 1, 10, 10]
    assert returns.mean() == 5.5


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_video_gif_of_one_episode_and_mp4_without_ffmpeg_is_a_clear_error(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", always_right)
    result = evaluate_run(EvalOptions(run, episodes=1, video=tmp_path / "episode.gif"))
    gif = Image.open(tmp_path / "episode.gif")
    assert gif.format == "GIF" and gif.size == (600, 400)
    assert (
        gif.n_frames == result["video_frames"] == result["lengths"][0] + 1
    )  # reset frame + one per step

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="MP4 needs ffmpeg"):
        evaluate_run(EvalOptions(run, episodes=1, video=tmp_path / "episode.mp4"))


class StateChain(gymnasium.Env):
    """Discrete observations from -2 (a state's index, as FrozenLake's), rendered as frames."""

    metadata = {"render_modes": ["rgb_array"]}
    observation_space = gymnasium.spaces.Discrete(5, start=-2)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.render_mode, self._state, self._steps = render_mode, -2, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._state, self._steps = -2, 0
        return self._state, {}

    def step(self, action):
        self._state = min(2, self._state + 1) if int(action) == 1 else max(-2, self._state - 1)
        self._steps += 1
        return self._state, float(self._state == 2), False, self._steps == 6, {}

    def render(self):
        return np.full((8, 8, 3), 40 * (self._state + 2), np.uint8)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_video_of_an_env_with_discrete_observations_shows_the_policy_its_one_hot_states(tmp_path):
    """The render env gives the policy one-hot states, as training does, not the state's
    index, so the video is recorded (not refused as 'cannot be recorded')."""
    gymnasium.register("PodraceStateChain-v0", entry_point=StateChain)
    try:
        run = make_run(tmp_path / "run", cfg=tiny_config(**{"env.id": "PodraceStateChain-v0"}))
        result = evaluate_run(EvalOptions(run, episodes=1, video=tmp_path / "episode.gif"))
    finally:
        gymnasium.registry.pop("PodraceStateChain-v0", None)
    assert result["lengths"] == [6]
    assert Image.open(tmp_path / "episode.gif").n_frames == result["video_frames"] == 7


@pytest.mark.timeout(60)
def test_errors_come_before_anything_is_written(tmp_path):
    empty = tmp_path / "empty-run"
    empty.mkdir()
    with pytest.raises(ConfigError, match="no checkpoint in"):
        evaluate_run(EvalOptions(empty))
    (tmp_path / "afile").write_text("")
    with pytest.raises(ConfigError, match="afile is not a directory"):  # not "does not exist"
        evaluate_run(EvalOptions(tmp_path / "afile"))
    run = make_run(tmp_path / "run")
    existing = tmp_path / "results.json"
    existing.write_text("keep me")
    with pytest.raises(ConfigError, match="already exists"):
        evaluate_run(EvalOptions(run, output=existing))
    with pytest.raises(ConfigError, match=r"--episodes must be in \[1, 2,147,483,647\], got 0"):
        evaluate_run(EvalOptions(run, episodes=0))
    with pytest.raises(ConfigError, match="got 3,000,000,000"):  # would run until killed
        evaluate_run(EvalOptions(run, episodes=3_000_000_000))
    assert existing.read_text() == "keep me"
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.json"]


@pytest.mark.timeout(180)
def test_cli_eval_prints_statistics_and_exits_2_on_errors(tmp_path):
    run = make_run(tmp_path / "run")
    command = ("eval", str(run), "--episodes", "2")
    ok = run_podrace(*command, timeout=150)
    assert ok.returncode == 0, ok.stderr
    assert "return  mean" in ok.stdout and "results: " in ok.stdout
    assert (run / "eval-3.json").exists()

    bad = run_podrace(*command, "--checkpoint", "7", timeout=150)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        f"podrace: error: no checkpoint for step 7 in {run / 'checkpoints'} (saved: 3)"
    ]


def fail_if_called(what: str):
    def called(*args, **kwargs):
        raise AssertionError(f"{what} was called")

    return called


def unwritable_dir(path: Path) -> Path:
    """A directory this process cannot create files in: mode 0o500, or, as root (whom the
    mode does not stop), /proc, where nobody can create a file."""
    if os.geteuid() == 0:
        return Path("/proc")
    path.mkdir()
    path.chmod(0o500)
    return path


@pytest.mark.timeout(60)
def test_an_output_that_cannot_be_written_is_refused_before_loading(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run")
    monkeypatch.setattr(podrace.commands.eval, "read_run", fail_if_called("read_run"))
    monkeypatch.setattr(podrace.commands.eval, "make_env", fail_if_called("make_env"))
    locked = unwritable_dir(tmp_path / "locked")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    cases = [
        (EvalOptions(run, output=locked / "out.json"), f"cannot write {locked / 'out.json'}: "),
        (EvalOptions(run, video=locked / "v.gif"), f"cannot write {locked / 'v.gif'}: "),
        (EvalOptions(run, output=a_file / "out.json"), f"{a_file} is not a directory"),
        (EvalOptions(run, video=tmp_path / ("v" * 300 + ".gif")), "File name too long"),
        (EvalOptions(run, output=tmp_path / ("o" * 300 + ".json")), "File name too long"),
    ]
    for opts, message in cases:
        with pytest.raises(ConfigError) as error:
            evaluate_run(opts)
        assert message in str(error.value) and "\n" not in str(error.value)
    if os.geteuid() != 0:  # the default output goes into the run directory
        run.chmod(0o500)
        try:
            with pytest.raises(
                ConfigError,
                match=re.escape(
                    f"cannot write {run / 'eval-<step>.json'}: Permission denied "
                    "(choose another place with --output)"
                ),
            ):
                evaluate_run(EvalOptions(run))
        finally:
            run.chmod(0o700)
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["a-file", "run"] + (["locked"] if locked != Path("/proc") else [])
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seed", [-1, 2**31, 2**64])
def test_a_seed_out_of_range_is_refused_before_loading(tmp_path, monkeypatch, seed):
    run = make_run(tmp_path / "run")
    monkeypatch.setattr(podrace.commands.eval, "read_run", fail_if_called("read_run"))
    with pytest.raises(ConfigError, match=rf"^--seed must be in \[0, 2\*\*31 - 1\], got {seed}$"):
        evaluate_run(EvalOptions(run, seed=seed))
    monkeypatch.undo()
    assert (
        evaluate_run(EvalOptions(run, episodes=1, seed=2**31 - 1))["seed"] == 2**31 - 1
    )  # the bound is fine


USER_MODULE = """
import gymnasium
from tests.envs.user_envs import MatchEnv
gymnasium.register("podrace-eval-user/Match-v0", entry_point=MatchEnv)
"""


@pytest.mark.timeout(120)
def test_a_run_of_an_env_from_a_module_in_the_working_directory_evaluates(tmp_path, monkeypatch):
    """As `podrace train --env.id my_module:Env` finds my_module.py in the working directory
    (tests/envs/test_user_modules.py), so does `podrace eval` of its run."""
    env_id = "podrace_eval_user_envs:podrace-eval-user/Match-v0"
    module_in_the_working_directory(tmp_path, monkeypatch, "podrace_eval_user_envs", USER_MODULE)
    try:
        run = make_run(tmp_path / "run", cfg=tiny_config(**{"env.id": env_id}))
        # A new process: the module not imported, the working directory not on sys.path.
        sys.modules.pop("podrace_eval_user_envs")
        gymnasium.registry.pop("podrace-eval-user/Match-v0")
        sys.path.remove(str(tmp_path))
        result = evaluate_run(EvalOptions(run, episodes=2))
    finally:
        sys.modules.pop("podrace_eval_user_envs", None)
        gymnasium.registry.pop("podrace-eval-user/Match-v0", None)
    assert result["env_id"] == env_id and len(result["returns"]) == 2


@pytest.mark.timeout(120)
@pytest.mark.parametrize("read", [1, 2], ids=["while-reading-the-config", "while-restoring"])
def test_a_live_run_rotating_its_checkpoints_spares_the_one_being_evaluated(
    tmp_path, monkeypatch, read
):
    """`--checkpoint.keep 1`: the run writes 4 while eval reads 3; 3 stays until eval is done."""
    run = make_run(tmp_path / "run")
    verify, reads = podrace.checkpoints.read.verify_manifest, []

    def run_saves_meanwhile(step_dir: Path) -> None:
        reads.append(step_dir.name)
        if len(reads) == read:
            save_versions(checkpoint_dir(run), tiny_config(**{"checkpoint.keep": 1}), [4])
            assert checkpoint_steps(checkpoint_dir(run)) == [3, 4]
        verify(step_dir)

    monkeypatch.setattr(podrace.checkpoints.read, "verify_manifest", run_saves_meanwhile)
    result = evaluate_run(EvalOptions(run, episodes=1))
    assert result["checkpoint"] == 3 and reads == ["3", "3"]

    reads.clear()  # the next save deletes both; a step the user asked for is never replaced
    monkeypatch.setattr(
        podrace.checkpoints.read, "verify_manifest", lambda d: (reads.append(d.name), verify(d))
    )
    save_versions(checkpoint_dir(run), tiny_config(**{"checkpoint.keep": 1}), [5])
    assert checkpoint_steps(checkpoint_dir(run)) == [5]
    with pytest.raises(ConfigError, match=r"no checkpoint for step 4 .*\(saved: 5\)"):
        evaluate_run(EvalOptions(run, checkpoint=4))


@pytest.mark.timeout(120)
def test_eval_of_a_renamed_step_folder_is_a_corrupt_checkpoint(tmp_path):
    run = make_run(tmp_path / "run")
    os.rename(run / "checkpoints" / "3", run / "checkpoints" / "8")
    for checkpoint in (8, None):
        with pytest.raises(
            ConfigError,
            match=re.escape(
                f"corrupt checkpoint: {run / 'checkpoints' / '8' / 'meta'}: it holds update 3,"
            ),
        ):
            evaluate_run(EvalOptions(run, checkpoint=checkpoint, episodes=1))
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.json"]


@pytest.mark.timeout(300)
def test_eval_of_a_run_trained_with_an_env_factory_plays_that_factorys_envs(capsys, tmp_path):
    """The run's config names CartPole (unused with a factory): eval played CartPole."""
    from tests.helpers.cli import run_cli
    from tests.helpers.runs import factory_run

    run = factory_run(tmp_path, constant_envs)
    result = evaluate_run(EvalOptions(run, episodes=3))
    assert result["returns"] == [CONSTANT_RETURN] * 3, result["returns"]
    assert (result["env_factory"], result["env_id"]) == ("tests.envs.user_envs:constant_envs", None)
    assert "env factory tests.envs.user_envs:constant_envs (ppo), checkpoint 2" in summary(result)
    video = tmp_path / "episode.gif"
    with pytest.raises(
        ConfigError,
        match=re.escape(
            f"--video records an env made from an env id; the envs of {run} came from the env "
            "factory 'tests.envs.user_envs:constant_envs'"
        ),
    ):
        evaluate_run(EvalOptions(run, episodes=1, video=video))
    assert not video.exists()

    def local_envs(num_envs, seed):
        return constant_envs(num_envs, seed)

    other = factory_run(tmp_path, local_envs, **{"log.run_name": "g"})
    before = sorted(other.iterdir())
    code, out, err = run_cli(capsys, "eval", str(other))
    assert code == 2 and err.splitlines() == [
        f"podrace: error: cannot evaluate {other}: its envs came from the env factory "
        f"{local_envs.__qualname__!r}, which podrace cannot import (only a function or class "
        "defined at the top level of an importable module can be, not one defined inside a "
        "function or in a script run as __main__); evaluate it from Python with the same "
        "factory: podrace.commands.eval.evaluate_run(podrace.commands.eval.EvalOptions("
        f"{str(other)!r}), env_factory=factory)"
    ], err
    assert sorted(other.iterdir()) == before
    result = evaluate_run(EvalOptions(other, episodes=2), env_factory=local_envs)
    assert result["returns"] == [CONSTANT_RETURN] * 2
    assert result["env_factory"] == local_envs.__qualname__


@pytest.mark.timeout(120)
def test_eval_of_a_step_without_its_manifest_is_a_corrupt_checkpoint(tmp_path):
    """A step appears with its manifest (written before the rename), so one without it
    was damaged: eval refuses it rather than reading what it cannot verify."""
    run = make_run(tmp_path / "run")
    (checkpoint_dir(run) / "3" / "podrace_manifest.json").unlink()
    with pytest.raises(
        ConfigError, match=r"^corrupt checkpoint: .*/3 has no podrace_manifest.json"
    ):
        evaluate_run(EvalOptions(run, episodes=1))


@pytest.mark.timeout(120)
def test_a_latest_checkpoint_deleted_before_it_is_held_is_replaced_by_the_new_latest(
    tmp_path, monkeypatch
):
    """The window left: the run rotates 3 away between eval listing it and holding it."""
    run = make_run(tmp_path / "run")
    listed = []

    def list_then_rotate(directory: Path):
        listed.append(latest_step(directory))
        if len(listed) == 1:
            save_versions(directory, tiny_config(**{"checkpoint.keep": 1}), [4])
        return listed[-1]

    monkeypatch.setattr(podrace.commands.eval, "latest_step", list_then_rotate)
    result = evaluate_run(EvalOptions(run, episodes=1))
    assert listed[0] == 3 and result["checkpoint"] == 4


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "entry_point,message",
    [
        (
            MatchEnv,
            r"cannot be rendered by Gymnasium: MatchEnv\(\) takes no arguments",
        ),  # no render_mode
        (NoFrames, r"cannot be recorded: render\(\) gave None, not an RGB frame"),
    ],
    ids=["no-render-mode", "render-gives-none"],
)
def test_video_of_an_env_that_cannot_render_is_refused_before_playing(
    tmp_path, monkeypatch, entry_point, message
):
    gymnasium.register("PodraceNoRender-v0", entry_point=entry_point)
    try:
        run = make_run(tmp_path / "run", cfg=tiny_config(**{"env.id": "PodraceNoRender-v0"}))
        monkeypatch.setattr(podrace.commands.eval, "make_env", fail_if_called("make_env"))
        with pytest.raises(ConfigError, match=f"^env 'PodraceNoRender-v0' {message}") as error:
            evaluate_run(EvalOptions(run, episodes=2, video=tmp_path / "episode.gif"))
    finally:
        gymnasium.registry.pop("PodraceNoRender-v0", None)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "episode.gif").exists()
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.json"]


NO_RENDERER = """
import gymnasium
from tests.envs.user_envs import MatchEnv
from tests.envs.user_envs import NoFrames

gymnasium.register("podrace-norender/NoRenderMode-v0", entry_point=MatchEnv)
gymnasium.register("podrace-norender/NoFrames-v0", entry_point=NoFrames)
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "env,message",
    [
        ("NoRenderMode-v0", "cannot be rendered by Gymnasium: MatchEnv() takes no arguments"),
        ("NoFrames-v0", "cannot be recorded: render() gave None, not an RGB frame"),
    ],
)
def test_the_cli_refuses_a_video_of_an_env_without_a_renderer_in_its_one_line_only(
    tmp_path, monkeypatch, env, message
):
    """Gymnasium's warnings (render_mode not among the env's, no render fps, render() gave
    None) came as two to four lines of theirs ahead of podrace's error."""
    env_id = f"podrace_no_renderer:podrace-norender/{env}"
    (tmp_path / "podrace_no_renderer.py").write_text(NO_RENDERER)
    monkeypatch.setattr(
        sys, "path", [str(tmp_path)] + [p for p in sys.path if p not in ("", str(tmp_path))]
    )
    try:
        run = make_run(tmp_path / "run", cfg=tiny_config(**{"env.id": env_id}))
    finally:
        sys.modules.pop("podrace_no_renderer", None)
        for name in ("NoRenderMode-v0", "NoFrames-v0"):
            gymnasium.registry.pop(f"podrace-norender/{name}", None)
    video = tmp_path / "episode.gif"
    proc = run_podrace("eval", "run", "--video", str(video), cwd=tmp_path, timeout=150)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"podrace: error: env {env_id!r} {message}"), proc.stderr
    assert not video.exists() and sorted(p.name for p in run.iterdir()) == [
        "checkpoints",
        "config.json",
    ]


DYING_RENDER = """
import os
import gymnasium
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

class DyingRender(CartPoleEnv):
    def render(self):  # as MuJoCo's renderer does without an OpenGL platform: exit(1)
        print("ERROR: no OpenGL platform in this process", flush=True)
        os._exit(1)

gymnasium.register("podrace-dying/Render-v0", entry_point=DyingRender)
"""


@pytest.mark.timeout(120)
def test_a_renderer_that_ends_its_process_is_a_one_line_error_before_playing(tmp_path, monkeypatch):
    env_id = "podrace_dying_render:podrace-dying/Render-v0"
    module_in_the_working_directory(tmp_path, monkeypatch, "podrace_dying_render", DYING_RENDER)
    try:
        run = make_run(tmp_path / "run", cfg=tiny_config(**{"env.id": env_id}))
        monkeypatch.setattr(podrace.commands.eval, "make_env", fail_if_called("make_env"))
        with pytest.raises(ConfigError) as error:
            evaluate_run(EvalOptions(run, episodes=2, video=tmp_path / "episode.gif"))
    finally:
        sys.modules.pop("podrace_dying_render", None)
        gymnasium.registry.pop("podrace-dying/Render-v0", None)
    assert str(error.value) == (
        f"env {env_id!r} cannot be rendered here: rendering its first frame ended the "
        "process (exit code 1): ERROR: no OpenGL platform in this process"
    )
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.json"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_video_that_fails_after_playing_still_leaves_the_results(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run")

    def encoder_fails(frames, path):
        raise ConfigError(f"ffmpeg could not write {path}: Unknown encoder")

    monkeypatch.setattr(podrace.commands.eval, "write_video", encoder_fails)
    with pytest.raises(ConfigError) as error:
        evaluate_run(EvalOptions(run, episodes=2, video=tmp_path / "episode.gif"))
    assert str(error.value) == (
        f"ffmpeg could not write {tmp_path / 'episode.gif'}: Unknown encoder "
        f"(the results were written to {run / 'eval-3.json'})"
    )
    written = json.loads((run / "eval-3.json").read_text())
    assert written["episodes"] == 2 and len(written["returns"]) == 2 and "video" not in written
