"""Reading checkpoints back (see `podrace.checkpoints.files` for the format): every file checked
against the step's manifest before orbax reads it, the meta's fields checked for the types
they were written with, and the stored network and env spaces checked against the config
and env of the run that loads them. Every failure is one line (`ConfigError`) naming the
file and what is wrong with it."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from podrace import json_text
from podrace.algos.base import TrainState
from podrace.checkpoints.files import ONE_PROCESS, Writers, orbax_checkpointer
from podrace.checkpoints.manifest import verify_manifest
from podrace.checkpoints.orbax_loops import draining_loops
from podrace.checkpoints.state import RunState, spec_json
from podrace.checkpoints.steps import FORMAT, resolve_step
from podrace.config import ConfigError, TrainConfig
from podrace.config_dict import config_from_dict
from podrace.types import EnvSpec, PyTree


def _corrupt(step_dir: Path, item: str, error: Exception) -> ConfigError:
    """One-line ConfigError naming the damaged file (from tensorstore's message when it says)."""
    text = " ".join(str(error).split())
    files = re.findall(r'local file "([^"]+)"', text)
    where = files[-1] if files else str(step_dir / item)
    what = text.split("[tensorstore_spec")[0]
    what = (
        what.rsplit(f'"{where}":', 1)[-1].strip(" :;")
        if files
        else f"{type(error).__name__}: {what}"
    )
    return ConfigError(f"corrupt checkpoint: {where}: {what[:300]}")


def _read_item(
    step_dir: Path,
    item: str,
    read: typing.Callable[[ocp.Checkpointer], Any],
    writers: Writers = ONE_PROCESS,
) -> Any:
    """`read(checkpointer)`; any failure is a one-line "corrupt checkpoint" ConfigError.
    Several processes read together (`writers`), each its own shards."""
    orbax = orbax_checkpointer(writers, f"podrace-read-{item}-{step_dir.name}")
    try:
        with draining_loops():
            return read(orbax)
    except Exception as error:  # orbax/tensorstore raise many types; all mean "unreadable"
        raise _corrupt(step_dir, item, error) from None
    finally:
        orbax.close()


META_FILE = "meta/metadata"
"""Where orbax's JSON handler keeps the `meta` item: read as plain JSON, so reading a
checkpoint's config starts no JAX backend (a multi-host process must join the others
before its backend starts)."""


def _read_meta_json(step_dir: Path) -> Any:
    path = step_dir / META_FILE
    try:
        return json_text.loads(path.read_bytes())
    except OSError as error:
        raise ConfigError(
            f"corrupt checkpoint: cannot read {path}: {error.strerror or error}"
        ) from None
    except (ValueError, TypeError) as error:  # UnicodeDecodeError is a ValueError
        text = " ".join(str(error).split())[:200]
        raise ConfigError(f"corrupt checkpoint: {path} is not valid JSON ({text})") from None


_META_FIELDS = {
    "config": dict,
    "env_spec": dict,
    "version": int,
    "env_steps": int,
    "episodes": int,
    "actor_next_seq": list,
}
_OPTIONAL_META = {"time_s": (int, float), "skipped_updates": int}
"""Absent in checkpoints of older podrace (read as 0)."""


def _check_meta(step_dir: Path, meta: dict) -> None:
    """ConfigError unless every field restore() and the CLIs read has the type save() wrote."""

    def problem(name: str, what: str) -> ConfigError:
        return ConfigError(f"corrupt checkpoint: {step_dir / 'meta'}: {what}")

    def count(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    for name, kind in _META_FIELDS.items():
        if name not in meta:
            raise problem(name, f"{name!r} is missing")
        value = meta[name]
        ok = count(value) if kind is int else isinstance(value, kind)
        if ok and name == "actor_next_seq":
            ok = bool(value) and all(count(v) for v in value)
        if not ok:
            wanted = {
                int: "a non-negative integer",
                dict: "a mapping",
                list: "a list of non-negative integers",
            }[kind]
            raise problem(name, f"{name!r} must be {wanted}, got {json.dumps(value)[:80]}")
    for name, kinds in _OPTIONAL_META.items():
        value = meta.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, kinds) or value < 0:
            raise problem(
                name, f"{name!r} must be a non-negative number, got {json.dumps(value)[:80]}"
            )
    restarts = meta.get("actor_restarts", [])
    if not (
        isinstance(restarts, list)
        and all(count(r) for r in restarts)
        and len(restarts) in (0, len(meta["actor_next_seq"]))
    ):
        raise problem(
            "actor_restarts",
            "'actor_restarts' must be a list of non-negative integers, one per actor, got "
            f"{json.dumps(restarts)[:80]}",
        )
    counters = meta.get("counters", [{}])  # absent in checkpoints of older podrace
    if not (
        isinstance(counters, list)
        and counters
        and all(
            isinstance(c, dict)
            and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
                for v in c.values()
            )
            for c in counters
        )
    ):
        raise problem(
            "counters",
            "'counters' must be a list of {name: non-negative number}, one per process, got "
            f"{json.dumps(counters)[:80]}",
        )
    factory = meta.get("env_factory")  # absent: envs from the config's env id
    reference = factory.get("import") if isinstance(factory, dict) else None
    if "env_factory" in meta and not (
        isinstance(factory, dict)
        and set(factory) == {"name", "import"}
        and isinstance(factory["name"], str)
        and (reference is None or re.fullmatch(r"[\w.]+:[\w.]+", str(reference)))
    ):
        raise problem(
            "env_factory",
            '\'env_factory\' must be {"name": str, "import": "module:qualname" or null}, '
            f"got {json.dumps(factory)[:80]}",
        )


def _stored_config(step_dir: Path, meta: dict) -> TrainConfig:
    """The config saved in `meta`, checked as a run's config is (types, then validate())."""
    from podrace.validation import validate

    where = f"config of checkpoint {step_dir}"
    try:
        cfg = config_from_dict(meta["config"], where=where)  # its errors name `where`
    except ConfigError as error:
        raise ConfigError(f"corrupt checkpoint: {error}") from None
    except (TypeError, ValueError) as error:
        raise ConfigError(
            f"corrupt checkpoint: {where}: {' '.join(str(error).split())[:200]}"
        ) from None
    try:
        validate(cfg)
    except ConfigError as error:
        raise ConfigError(f"corrupt checkpoint: {where}: {error}") from None
    return cfg


def _read(directory: Path, step: int | None) -> tuple[int, Path, dict, TrainConfig]:
    """(step, its directory, meta JSON, config) of a checkpoint, after verifying its files."""
    directory = Path(directory).absolute()
    step = resolve_step(directory, step)
    step_dir = directory / str(step)
    verify_manifest(step_dir)
    meta = _read_meta_json(step_dir)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise ConfigError(
            f"checkpoint {step_dir} has format {found}, this podrace reads format {FORMAT}"
        )
    _check_meta(step_dir, meta)
    if meta["version"] != step:
        # The folder's name is the step a resume continues from and names its later steps
        # by: loading another update under it would make the run's counters disagree.
        raise ConfigError(
            f"corrupt checkpoint: {step_dir / 'meta'}: it holds update {meta['version']}, "
            f"but its folder is named {step} (a step folder must keep the name it was written with)"
        )
    return step, step_dir, meta, _stored_config(step_dir, meta)


def read_meta(directory: Path, step: int | None = None) -> tuple[int, dict]:
    """(step, meta JSON) of a checkpoint, after verifying its files and fields."""
    step, _, meta, _ = _read(directory, step)
    return step, meta


def read_config(directory: Path, step: int | None = None) -> tuple[int, TrainConfig]:
    """(step, the resolved config the checkpoint was saved with)."""
    step, _, _, cfg = _read(directory, step)
    return step, cfg


def read_run(directory: Path, step: int | None = None) -> tuple[int, TrainConfig, dict | None]:
    """(step, config, env factory record) of a checkpoint: what a resume or an eval builds
    the run's envs from (`podrace.envs.source.stored_env_source`; None: the config's env id,
    as in every checkpoint of a run without an env factory and of older podrace)."""
    step, _, meta, cfg = _read(directory, step)
    return step, cfg, meta.get("env_factory")


def _flat_shapes(tree: PyTree) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """{dotted path: (shape, dtype)} with orbax's naming (dict keys, field names, indices)."""

    def part(key) -> str:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                return str(getattr(key, attr))
        return str(key)

    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {
        ".".join(part(k) for k in path): (tuple(x.shape), np.dtype(x.dtype)) for path, x in leaves
    }


def _check_fits(
    step_dir: Path, meta: dict, cfg: TrainConfig, like: RunState, spec: EnvSpec, writers: Writers
) -> None:
    stored, current = meta["env_spec"], spec_json(spec)
    for name, value in stored.items():
        if current.get(name) != value:
            why = (
                " (Discrete observations are one-hot since podrace 2026-12-06; "
                "this run predates it)"
                if (name == "obs_shape" and value == [] and current.get("obs_dtype") == "float32")
                else ""
            )
            raise ConfigError(
                f"checkpoint {step_dir} was saved for env {cfg.env.id!r} with {name} {value}, "
                f"the config's env has {current.get(name)}{why}"
            )
    metadata = _read_item(
        step_dir, "arrays", lambda c: c.metadata(step_dir).item_metadata["arrays"], writers
    )
    saved = {
        m.name: (tuple(m.shape), np.dtype(m.dtype))
        for m in jax.tree.leaves(getattr(metadata, "tree", metadata))
        if hasattr(m, "shape")
    }
    wanted = _flat_shapes(like.arrays())
    problems = []
    for name, (shape, dtype) in wanted.items():
        if name not in saved:
            problems.append(f"{name} is missing from the checkpoint")
        elif saved[name] != (shape, dtype):
            s_shape, s_dtype = saved[name]
            problems.append(
                f"{name} is {s_dtype.name}{list(s_shape)} in the checkpoint, "
                f"{dtype.name}{list(shape)} under this config"
            )
    problems += [
        f"{name} is in the checkpoint but not in this config"
        for name in saved
        if name not in wanted
    ]
    if problems:
        more = f" (and {len(problems) - 1} more differences)" if len(problems) > 1 else ""
        raise ConfigError(f"checkpoint {step_dir} does not fit this config: {problems[0]}{more}")


def restore(
    directory: Path,
    like: RunState,
    spec: EnvSpec,
    step: int | None = None,
    writers: Writers = ONE_PROCESS,
) -> RunState:
    """The checkpoint at `step` (default: latest) as a RunState shaped and placed like `like`.

    `like`'s array leaves (arrays or jax.ShapeDtypeStruct) give shapes, dtypes and, where
    they have one, the sharding to restore onto; other leaves come back as NumPy arrays.
    ConfigError (one line) when there is no checkpoint, it is corrupt, or it does not fit
    `like` or `spec`. Several processes (`writers`) restore together, each its own shards.
    """
    step, step_dir, meta, cfg = _read(directory, step)
    _check_fits(step_dir, meta, cfg, like, spec, writers)
    actors = like.actor_keys.shape[0]  # as saved: _check_fits compared the shapes
    if len(meta["actor_next_seq"]) != actors:
        raise ConfigError(
            f"corrupt checkpoint: {step_dir / 'meta'}: 'actor_next_seq' has "
            f"{len(meta['actor_next_seq'])} entries for {actors} actors"
        )

    def target(x):
        sharding = getattr(x, "sharding", None)
        if isinstance(x, np.ndarray) or sharding is None:
            return np.zeros(x.shape, x.dtype)  # restored as a NumPy array
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    template = jax.tree.map(target, like.arrays())
    arrays = _read_item(
        step_dir,
        "arrays",
        lambda c: c.restore(
            step_dir, args=ocp.args.Composite(arrays=ocp.args.StandardRestore(template))
        ),
        writers,
    )
    arrays = arrays["arrays"]
    return RunState(
        train_state=TrainState(*arrays["train_state"]),
        learner_keys=arrays["learner_keys"],
        actor_keys=arrays["actor_keys"],
        actor_next_seq=tuple(meta["actor_next_seq"]),
        version=meta["version"],
        env_steps=meta["env_steps"],
        episodes=meta["episodes"],
        normalizer=arrays.get("normalizer"),
        time_s=float(meta.get("time_s", 0.0)),  # absent in checkpoints of older podrace
        skipped_updates=int(meta.get("skipped_updates", 0)),
        actor_restarts=tuple(meta.get("actor_restarts") or (0,) * actors),
        counters=_counters_of(step_dir, meta, writers.process_id),
    )


def _counters_of(step_dir: Path, meta: dict, process_id: int) -> dict[str, float]:
    """Process `process_id`'s counters in `meta` (a checkpoint of older podrace kept only
    the run's env steps, episodes and skipped updates: those)."""
    if "counters" not in meta:
        return {
            "env_steps": float(meta["env_steps"]),
            "episodes": float(meta["episodes"]),
            "learner/skipped_nonfinite": float(meta.get("skipped_updates", 0)),
        }
    every = meta["counters"]
    if process_id >= len(every):
        raise ConfigError(
            f"corrupt checkpoint: {step_dir / 'meta'}: 'counters' has {len(every)} entries, "
            f"none for process {process_id}"
        )
    return {name: float(value) for name, value in every[process_id].items()}
