"""`podrace eval --video`: one episode of a checkpoint's policy in an env made to render,
as a GIF (Pillow) or an MP4 (ffmpeg).

Whether the env can render is checked before any episode is played, in a child process:
some renderers end the process that asks them instead of raising (MuJoCo's
`mjr_makeContext` without an OpenGL platform calls exit(1)), and that must be a one-line
error of `podrace eval`, not its death.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from podrace.config import ConfigError, EnvConfig
from podrace.envs import resolve_backend
from podrace.envs.spaces import ObsIndices, OneHotObs

MAX_VIDEO_FRAMES = 3000
VIDEO_FPS = 30
RENDER_CHECK_TIMEOUT_S = 120.0
"""The child that renders one frame: an env's import and first frame, with room for a busy
machine."""


class _RenderEnv:
    """One env of `cfg.id` made with render_mode='rgb_array': reset, step, render, close."""

    def __init__(self, cfg: EnvConfig, seed: int):
        self.env_id, self.seed = cfg.id, seed
        backend = resolve_backend(cfg)
        if backend == "jax":
            raise ConfigError(
                f"env {cfg.id!r} is written in JAX (env.backend jax): --video renders envpool "
                "and Gymnasium envs only"
            )
        if backend == "envpool":
            import envpool

            from podrace.envs.envpool_backend import make_kwargs
            from podrace.envs.resolve import is_envpool_atari

            try:
                self.env = envpool.make(
                    cfg.id,
                    env_type="gymnasium",
                    num_envs=1,
                    batch_size=1,
                    seed=seed,
                    render_mode="rgb_array",
                    **make_kwargs(cfg),
                )
            except Exception as error:
                raise ConfigError(
                    f"env {cfg.id!r} cannot be rendered by envpool: {_one_line(error)}"
                ) from None
            self.envpool, self.atari = True, is_envpool_atari(cfg.id)
        else:
            import gymnasium

            from podrace.envs.gymnasium_backend import make_kwargs

            try:
                self.env = gymnasium.make(cfg.id, render_mode="rgb_array", **make_kwargs(cfg))
            except Exception as error:  # e.g. DependencyNotInstalled (pygame) for classic control
                raise ConfigError(
                    f"env {cfg.id!r} cannot be rendered by Gymnasium: {_one_line(error)}"
                ) from None
            self.envpool, self.atari = False, False
        self.one_hot = OneHotObs.of(self.env.observation_space)
        shape = (self.one_hot.n,) if self.one_hot else tuple(self.env.observation_space.shape)
        self.select = None
        if cfg.obs_indices is not None:
            self.select = ObsIndices(cfg.obs_indices, shape, cfg.id)

    def reset(self) -> np.ndarray:
        """The first observation, batched as the policy takes it ([1, ...])."""
        if self.envpool:
            return self._as_trained(self.env.reset()[0])
        return self._as_trained(np.asarray(self.env.reset(seed=self.seed)[0])[None])

    def step(self, action: np.ndarray) -> tuple[np.ndarray, bool]:
        if self.envpool:
            obs, _, terminated, truncated, info = self.env.step(action)
            over = (
                info["terminated"] if self.atari else terminated
            )  # Atari: game over, not a lost life
            return self._as_trained(obs), bool(over[0] or truncated[0])
        obs, _, terminated, truncated, _ = self.env.step(action[0])
        return self._as_trained(np.asarray(obs)[None]), bool(terminated or truncated)

    def _as_trained(self, obs: np.ndarray) -> np.ndarray:
        """As the training envs gave them (a Discrete observation one-hot, the entries
        `env.obs_indices` keeps; as in podrace.envs)."""
        obs = obs if self.one_hot is None else self.one_hot(obs)
        return obs if self.select is None else self.select(obs)

    def render(self) -> np.ndarray:
        """An RGB frame [height, width, 3]; ConfigError when the env gives none."""
        frame = self.env.render()
        if self.envpool and frame is not None:
            frame = frame[0]
        frame = None if frame is None else np.asarray(frame)
        if frame is None or frame.ndim != 3 or frame.shape[-1] != 3 or 0 in frame.shape:
            got = "None" if frame is None else f"an array of shape {list(frame.shape)}"
            raise ConfigError(
                f"env {self.env_id!r} cannot be recorded: render() gave {got}, not an RGB frame"
            )
        return frame

    def close(self) -> None:
        self.env.close()


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def _rendering(cfg: EnvConfig, seed: int, use: Callable[[_RenderEnv], object]):
    """`use(env)` on a fresh render env, closed after; what the env raises is a ConfigError.

    Gymnasium's warnings about rendering (a render_mode the env does not list, no
    render_fps, a frame that is not an array) are dropped: podrace checks the frames itself,
    says in one line what is wrong, and writes the video at its own frame rate."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module=r"gymnasium(\.|$)")
        env = _RenderEnv(cfg, seed)
        try:
            return use(env)
        except ConfigError:
            raise
        except Exception as error:  # e.g. NotImplementedError from an env without render()
            raise ConfigError(
                f"env {cfg.id!r} cannot be recorded: {type(error).__name__}: "
                f"{_one_line(error)[:300]}"
            ) from None
        finally:
            env.close()


def check_renderable(cfg: EnvConfig, seed: int) -> None:
    """ConfigError unless an env of `cfg.id` gives an RGB frame after reset (one env, one
    frame: checked before any episode is played, so --video cannot fail only at the end).

    First in a child process, so a renderer that ends its process costs the child, not
    `podrace eval`. Where the child could not render (an error, not its death), the check
    runs again here, whose answer counts: an env registered only in this process (a library
    user's `gymnasium.register`) is unknown to the child."""
    child = [
        sys.executable,
        "-c",
        "from podrace.video import _render_check_child; _render_check_child()",
    ]
    try:
        done = subprocess.run(
            child,
            input=pickle.dumps((cfg, seed)),
            capture_output=True,
            timeout=RENDER_CHECK_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"env {cfg.id!r} gave no frame within {RENDER_CHECK_TIMEOUT_S:g}s of starting to render"
        ) from None
    if done.returncode == 0:
        return
    if done.returncode == RENDER_CHECK_FAILED:
        _rendering(cfg, seed, _first_frame)
        return
    lines = [
        line.strip()
        for out in (done.stderr, done.stdout)
        for line in out.decode(errors="replace").splitlines()
        if line.strip()
    ]
    ended = f"exit code {done.returncode}" if done.returncode > 0 else f"signal {-done.returncode}"
    said = f": {' '.join(lines[-1].split())[:300]}" if lines else ""
    raise ConfigError(
        f"env {cfg.id!r} cannot be rendered here: rendering its first frame ended the process "
        f"({ended}){said}"
    )


RENDER_CHECK_FAILED = 3
"""The child's exit code when it could not render and said so (any exception)."""


def _first_frame(env: _RenderEnv) -> None:
    env.reset()
    env.render()


def _render_check_child() -> None:
    """The child's side of `check_renderable`: (EnvConfig, seed) pickled on stdin; exit 0
    with a frame, RENDER_CHECK_FAILED on any exception."""
    try:
        from podrace.envs import silence_env_warnings
        from podrace.envs.user_modules import make_working_dir_importable

        cfg, seed = pickle.load(sys.stdin.buffer)
        silence_env_warnings()
        make_working_dir_importable(cfg.id)
        _rendering(cfg, seed, _first_frame)
    except BaseException:  # noqa: BLE001 - the parent checks again in its own process
        sys.exit(RENDER_CHECK_FAILED)


def record_episode(cfg: EnvConfig, policy: Callable, seed: int) -> list[np.ndarray]:
    """RGB frames of one episode in an env of `cfg.id` made with render_mode='rgb_array'."""

    def episode(env: _RenderEnv) -> list[np.ndarray]:
        obs = env.reset()
        frames, done = [env.render()], False
        while not done and len(frames) < MAX_VIDEO_FRAMES:
            obs, done = env.step(policy(obs))
            frames.append(env.render())
        return frames

    return _rendering(cfg, seed, episode)


def write_video(frames: list[np.ndarray], path: Path) -> None:
    """GIF with Pillow or MP4 with ffmpeg; written to a temp file, then renamed."""
    tmp = path.with_name(f".{path.name}.tmp{path.suffix}")
    try:
        if path.suffix.lower() == ".gif":
            from PIL import Image

            images = [Image.fromarray(np.asarray(f, np.uint8)) for f in frames]
            images[0].save(
                tmp,
                format="GIF",
                save_all=True,
                append_images=images[1:],
                duration=round(1000 / VIDEO_FPS),
                loop=0,
            )
        else:
            height, width = frames[0].shape[:2]
            command = [
                "ffmpeg",
                "-loglevel",
                "error",
                "-y",
                "-f",
                "rawvideo",
                "-pix_fmt",
                "rgb24",
                "-s",
                f"{width}x{height}",
                "-r",
                str(VIDEO_FPS),
                "-i",
                "-",
                "-vf",
                "pad=ceil(iw/2)*2:ceil(ih/2)*2",
                "-pix_fmt",
                "yuv420p",
                str(tmp),
            ]
            data = b"".join(np.ascontiguousarray(f, np.uint8).tobytes() for f in frames)
            result = subprocess.run(command, input=data, capture_output=True)
            if result.returncode:
                message = " ".join(result.stderr.decode(errors="replace").split())
                raise ConfigError(f"ffmpeg could not write {path}: {message[:300]}")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
