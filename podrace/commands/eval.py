"""`podrace eval RUN_DIR`: a checkpoint's policy on fresh envs; statistics, JSON, a video.

Every input is checked (run directory, checkpoint, output and video paths, encoder) before
any env is built, so a mistake costs nothing and never overwrites a file. Each env plays a
fixed share of the episodes (its first ones), so short episodes are not over-counted the
way "the first N episodes to finish" would. The policy plays through
`podrace.commands.playing`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
import tyro

from podrace import json_text
from podrace.algos.normalizer import acting_apply, acting_params
from podrace.checkpoints.read import read_run, restore
from podrace.checkpoints.state import RunState, abstract_run_state, checkpoint_dir
from podrace.checkpoints.steps import latest_step, step_lock
from podrace.commands.outputs import check_writable
from podrace.commands.playing import make_actor, play_episodes
from podrace.commands.std_streams import print_error, print_result
from podrace.commands.supervisor import signals_deferred
from podrace.config import ConfigError, TrainConfig
from podrace.envs import EnvFactory, EnvSource, make_env
from podrace.envs.source import (
    FactoryNotImportable,
    factory_name,
    factory_reference,
    stored_env_source,
)
from podrace.envs.user_modules import make_working_dir_importable
from podrace.evaluate import STUCK_EPISODE_STEPS
from podrace.networks import make_network
from podrace.types import EnvSpec
from podrace.validation import INT32_MAX, check_seed
from podrace.video import check_renderable, record_episode, write_video
from podrace.wording import counted

MAX_EVAL_ENVS = 16
ROTATION_RETRIES = 5
"""Without --checkpoint, how many times a latest checkpoint that a live run rotated away
(`--checkpoint.keep`) between listing and holding it is replaced by the new latest."""


@dataclass(frozen=True)
class EvalOptions:
    """Evaluate a checkpoint of a run on fresh environments."""

    run_dir: Annotated[tyro.conf.Positional[Path], tyro.conf.arg(metavar="RUN_DIR")]
    """Run directory written by `podrace train`."""
    checkpoint: int | None = None
    """Checkpoint step (learner updates) to load; default: the latest."""
    episodes: int = 10
    """Episodes to play."""
    stochastic: bool = False
    """Sample actions from the policy instead of taking its most likely action."""
    video: Path | None = None
    """Also record one episode to this .gif (or .mp4, needs ffmpeg on PATH)."""
    seed: int = 0
    """Seed of the evaluation envs (and of sampled actions with --stochastic)."""
    output: Annotated[Path | None, tyro.conf.arg(aliases=("-o",))] = None
    """JSON file for the results; default RUN_DIR/eval-<step>.json (never overwritten)."""


def _free_path(path: Path) -> Path:
    """`path`, or `name-2.json`, `name-3.json`, ... if it exists."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return candidate


def _check_options(opts: EvalOptions) -> None:
    """Every argument, and that the results (and video) can be written, before any loading."""
    if not 0 < opts.episodes <= INT32_MAX:  # as training's eval.episodes
        raise ConfigError(f"--episodes must be in [1, {INT32_MAX:,}], got {opts.episodes:,}")
    check_seed("--seed", opts.seed)
    try:
        _check_paths(opts)
    except OSError as error:  # e.g. a name too long for the file system
        raise ConfigError(f"cannot use {error.filename}: {error.strerror or error}") from None


def _check_paths(opts: EvalOptions) -> None:
    if not opts.run_dir.is_dir():
        problem = "is not a directory" if opts.run_dir.exists() else "does not exist"
        raise ConfigError(f"run directory {opts.run_dir} {problem}")
    if opts.output is not None and opts.output.exists():
        raise ConfigError(f"{opts.output} already exists; choose another --output")
    if opts.output is not None:
        check_writable(opts.output)
    else:  # into the run directory, under a name that depends on the step
        try:
            check_writable(opts.run_dir / "eval-<step>.json")
        except ConfigError as error:
            raise ConfigError(f"{error} (choose another place with --output)") from None
    if opts.video is not None:
        suffix = opts.video.suffix.lower()
        if suffix not in (".gif", ".mp4"):
            raise ConfigError(f"--video must end in .gif or .mp4, got {opts.video}")
        if opts.video.exists():
            raise ConfigError(f"{opts.video} already exists; choose another --video")
        check_writable(opts.video)
        if suffix == ".mp4" and shutil.which("ffmpeg") is None:
            raise ConfigError(
                "writing an MP4 needs ffmpeg on PATH, which was not found; use a .gif path"
            )


def _factory_name(factory: EnvFactory) -> str:
    """'module:qualname' of an importable factory, else its name."""
    return factory_reference(factory) or factory_name(factory)


def _stats(values: np.ndarray) -> dict[str, float]:
    return {
        "mean": float(values.mean()),
        "std": float(values.std()),
        "min": float(values.min()),
        "max": float(values.max()),
    }


# The command --------------------------------------------------------------------------


def load_checkpoint(
    opts: EvalOptions, env_factory: EnvFactory | None = None
) -> tuple[int, TrainConfig, EnvSource, EnvSpec, RunState]:
    """(step, config, where the envs come from, env spec, state) of --checkpoint, or of the
    latest checkpoint. The envs: `env_factory` when given, else the env factory the run
    recorded (imported), else the config's env id; a recorded factory that cannot be
    imported is a ConfigError saying how to evaluate the run from Python.

    A live run with `--checkpoint.keep K` deletes its oldest checkpoints after writing a new
    one. The step read here is held (`step_lock`), so the rotation spares it until the
    arrays are read, but it can be deleted between listing and holding: then the new latest
    is taken instead, up to ROTATION_RETRIES times. A step the user asked for is never
    replaced.
    """
    directory = checkpoint_dir(opts.run_dir)
    for attempt in range(ROTATION_RETRIES + 1):
        step = opts.checkpoint if opts.checkpoint is not None else latest_step(directory)
        try:
            # Held from the config to the arrays: the run's rotation cannot delete it meanwhile.
            with step_lock(directory / str(step), shared=True):
                step, cfg, record = read_run(directory, step)
                make_working_dir_importable(
                    cfg.env.id
                )  # a `module:Env` id, as `podrace train` does
                source = _env_source(opts, cfg, record, env_factory)
                spec = source.spec()
                state = restore(directory, abstract_run_state(cfg, spec), spec, step)
            return step, cfg, source, spec, state
        except ConfigError:
            newer = latest_step(directory)
            rotated = (
                opts.checkpoint is None and step is not None and newer is not None and newer > step
            )
            if not rotated or attempt == ROTATION_RETRIES:
                raise
    raise AssertionError("unreachable")


def _env_source(
    opts: EvalOptions, cfg: TrainConfig, record: dict | None, env_factory: EnvFactory | None
) -> EnvSource:
    given = EnvSource(cfg.env, env_factory) if env_factory is not None else None
    try:
        return stored_env_source(cfg.env, record, given)
    except FactoryNotImportable as error:
        raise ConfigError(
            f"cannot evaluate {opts.run_dir}: {error}; evaluate it from Python with the same "
            "factory: podrace.commands.eval.evaluate_run(podrace.commands.eval.EvalOptions("
            f"{str(opts.run_dir)!r}), env_factory=factory)"
        ) from None


def evaluate_run(opts: EvalOptions, env_factory: EnvFactory | None = None) -> dict:
    """Load, play, print, write JSON (and a video). ConfigError for every user mistake.

    `env_factory`: the envs to play, for a run trained with `podrace.train(cfg,
    env_factory=...)`; by default the factory the run recorded, or its config's env id."""
    _check_options(opts)
    step, cfg, source, spec, state = load_checkpoint(opts, env_factory)
    output = opts.output or _free_path(opts.run_dir / f"eval-{step}.json")
    factory = None if source.factory is None else _factory_name(source.factory)
    if opts.video is not None and factory is not None:
        raise ConfigError(
            f"--video records an env made from an env id; the envs of {opts.run_dir} came from "
            f"the env factory {factory!r}"
        )
    if opts.video is not None:
        check_renderable(cfg.env, opts.seed)
    network = make_network(cfg.network, spec)
    # As the run's actors did: with the observation statistics saved with these params.
    apply = acting_apply(network.apply, cfg.normalize)
    params = acting_params(state.train_state.params, state.normalizer)
    policy = make_actor(apply, params, opts.stochastic, opts.seed)

    num_envs = min(opts.episodes, MAX_EVAL_ENVS)
    env = (
        make_env(cfg.env, num_envs, opts.seed)
        if source.factory is None
        else source.make(num_envs, opts.seed)
    )
    try:
        tally = play_episodes(env, policy, opts.episodes, cfg.env.max_episode_steps)
    finally:
        env.close()
    returns, lengths = tally.result()
    if not len(returns):
        raise ConfigError(
            f"no eval env ended an episode in {STUCK_EPISODE_STEPS:,} steps: {cfg.env.id!r} "
            "needs a time limit the run declares (--env.max-episode-steps), or episodes that end"
        )
    result = {
        "run_dir": str(opts.run_dir),
        "checkpoint": step,
        "env_steps": state.env_steps,
        "env_id": cfg.env.id if factory is None else None,
        **({} if factory is None else {"env_factory": factory}),
        "algo": cfg.algo,
        "policy": "stochastic" if opts.stochastic else "deterministic",
        "seed": opts.seed,
        "episodes": len(returns),  # fewer than asked for only when every eval env was given up
        "episodes_asked": opts.episodes,
        "episodes_from_other_envs": tally.filled,  # shares of envs given up (EpisodeTally)
        "return": _stats(returns),
        "length": _stats(lengths),
        "returns": returns.tolist(),
        "lengths": lengths.tolist(),
    }
    video_error = None
    if opts.video is not None:
        try:
            frames = record_episode(
                cfg.env, make_actor(apply, params, opts.stochastic, opts.seed), opts.seed
            )
            with signals_deferred():
                write_video(frames, opts.video)
            result["video"] = str(opts.video)
            result["video_frames"] = len(frames)
        except ConfigError as error:  # the episodes' results are still written
            video_error = error
    _write_json(result, output)
    if video_error is not None:
        raise ConfigError(f"{video_error} (the results were written to {output})")
    result["output"] = str(output)
    return result


def _write_json(result: dict, output: Path) -> None:
    """Write atomically (temp file, rename); one line when it fails after all (disk full)."""
    tmp = output.with_name(f".{output.name}.tmp")
    with signals_deferred():
        try:
            tmp.write_text(json_text.dumps_strict(result, indent=2) + "\n")
            os.replace(tmp, output)
        except OSError as error:
            raise ConfigError(f"cannot write {output}: {error.strerror or error}") from None
        finally:
            tmp.unlink(missing_ok=True)


def _episodes(result: dict) -> str:
    played, asked, filled = (
        result["episodes"],
        result["episodes_asked"],
        result["episodes_from_other_envs"],
    )
    text = counted(played, "episode")
    if played != asked:
        text = f"{played} of {counted(asked, 'episode')}"
    return text + (f" ({filled} from other envs: some never ended theirs)" if filled else "")


def summary(result: dict) -> str:
    """What `podrace eval` prints."""
    env = (
        result["env_id"] if result["env_id"] is not None else f"env factory {result['env_factory']}"
    )
    lines = [
        f"{env} ({result['algo']}), checkpoint {result['checkpoint']} "
        f"({result['env_steps']:,} env steps): {_episodes(result)}, {result['policy']} policy"
    ]
    for name in ("return", "length"):
        s = result[name]
        lines.append(
            f"  {name:<7} mean {s['mean']:10,.2f}  std {s['std']:9,.2f}"
            f"  min {s['min']:10,.2f}  max {s['max']:10,.2f}"
        )
    if "video" in result:
        lines.append(f"video: {result['video']} ({result['video_frames']} frames)")
    lines.append(f"results: {result['output']}")
    return "\n".join(lines)


def eval_command(args: Sequence[str]) -> int:
    """`podrace eval RUN_DIR`: a checkpoint's policy on fresh envs; its exit code."""
    from podrace.commands.arguments import parse
    from podrace.envs import silence_env_warnings
    from podrace.runtime.xla_setup import enable_compile_cache

    silence_env_warnings()
    enable_compile_cache()
    try:
        opts = parse(lambda: tyro.cli(EvalOptions, prog="podrace eval", args=list(args)))
        result = evaluate_run(opts)
    except ConfigError as error:
        return print_error(str(error))
    return print_result(summary(result))
