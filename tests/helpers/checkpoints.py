"""Run states, checkpoint folders and run directories built without training."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import jax
import numpy as np

from podrace.checkpoints.files import Checkpointer
from podrace.checkpoints.state import RunState, checkpoint_dir
from podrace.config import TrainConfig
from podrace.envs import env_spec
from podrace.learner_mesh import make_algorithm
from podrace.networks import make_network


def fresh_state(cfg: TrainConfig, seed: int = 0, version: int = 0) -> RunState:
    """A RunState built the way a run starts (network init, algorithm init, keys)."""
    spec = env_spec(cfg.env)
    network = make_network(cfg.network, spec)
    params = network.init(jax.random.PRNGKey(seed), np.zeros((1,) + spec.obs_shape, spec.obs_dtype))
    train_state = make_algorithm(cfg, network.apply).init(params)
    return RunState(
        train_state=train_state,
        learner_keys=jax.random.split(
            jax.random.PRNGKey(seed + 1), cfg.num_actors * cfg.env.num_envs
        ),
        actor_keys=np.asarray(jax.random.split(jax.random.PRNGKey(seed + 2), cfg.num_actors)),
        actor_next_seq=tuple(range(version, version + cfg.num_actors)),
        version=version,
        env_steps=version * cfg.steps_per_update,
        episodes=3 * version,
    )


def save_versions(
    directory: Path, cfg: TrainConfig, versions: Iterable[int]
) -> dict[int, RunState]:
    """Checkpoints of `fresh_state(cfg, seed=v, version=v)` for each v, in `directory`."""
    versions = list(versions)
    states = {v: fresh_state(cfg, seed=v, version=v) for v in versions}
    checkpointer = Checkpointer(directory, cfg, env_spec(cfg.env))
    try:
        for v in versions:
            checkpointer.save(states[v])
    finally:
        checkpointer.close()
    return states


def metrics_line(version: int, env_steps: int, time_s: float, **more: object) -> str:
    """One line of metrics.jsonl."""
    return json.dumps({"version": version, "env_steps": env_steps, "time_s": time_s, **more})


def fake_run(tmp_path: Path, cfg: TrainConfig, versions: Iterable[int] = (2,)) -> Path:
    """A run directory as `podrace train` leaves it, without training (config, lines,
    checkpoints of `versions`)."""
    run_dir = tmp_path / cfg.log.run_name
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({}))
    (run_dir / "metrics.jsonl").write_text(
        metrics_line(1, 256, 0.5) + "\n" + metrics_line(3, 768, 1.5) + "\n"
    )
    versions = list(versions)
    if versions:
        save_versions(checkpoint_dir(run_dir), cfg, versions)
    return run_dir


def snapshot(directory: Path) -> dict[Path, bytes]:
    """Every file under `directory` and its bytes: compare two to see that nothing changed."""
    return {p: p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def flip_a_byte(step_dir: Path) -> Path:
    """Flips one byte in the middle of the largest file of checkpoint `step_dir` (its
    arrays), as a disk's corruption would; returns that file."""
    array_file = max(
        (p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size
    )
    data = bytearray(array_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    array_file.write_bytes(bytes(data))
    return array_file
