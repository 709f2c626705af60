"""`podrace eval` of a multi-host run's checkpoint: one process plays its params."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from podrace.algos.normalizer import init_normalizer
from podrace.checkpoints.files import Checkpointer
from podrace.checkpoints.state import RunState, checkpoint_dir
from podrace.commands.eval import EvalOptions, evaluate_run, summary
from podrace.config import TrainConfig, replace
from podrace.envs import env_spec
from podrace.learner_mesh import make_algorithm
from podrace.networks import make_network

PROCESSES = 2


def save_as_two_processes(run_dir, version: int) -> TrainConfig:
    """A checkpoint with what a 2-process run saves: its config (resolved: the process
    count and this process's id), every process's actor and learner keys, the normalizer
    statistics of every process's envs."""
    cfg = replace(
        TrainConfig(),
        **{
            "network.hidden_sizes": (8,),
            "normalize.obs": True,
            "distributed.coordinator": "127.0.0.1:9",
            "distributed.num_processes": PROCESSES,
            "distributed.process_id": 0,
        },
    )
    spec = env_spec(cfg.env)
    network = make_network(cfg.network, spec)
    params = network.init(jax.random.PRNGKey(0), np.zeros((1,) + spec.obs_shape, spec.obs_dtype))
    actors = PROCESSES * cfg.num_actors
    envs = actors * cfg.env.num_envs
    state = RunState(
        train_state=make_algorithm(cfg, network.apply).init(params),
        learner_keys=jax.random.split(jax.random.PRNGKey(1), envs),
        actor_keys=np.asarray(jax.random.split(jax.random.PRNGKey(2), actors)),
        actor_next_seq=(version,) * actors,
        version=version,
        env_steps=version * cfg.steps_per_update,
        episodes=7,
        normalizer=init_normalizer(cfg.normalize, spec.obs_shape, envs),
    )
    checkpointer = Checkpointer(checkpoint_dir(run_dir), cfg, spec)
    try:
        checkpointer.save(state)
    finally:
        checkpointer.close()
    return cfg


@pytest.mark.timeout(120)
def test_eval_of_a_multi_host_checkpoint_plays_its_params_in_one_process(tmp_path):
    run_dir = tmp_path / "r"
    save_as_two_processes(run_dir, version=5)
    result = evaluate_run(EvalOptions(run_dir, episodes=1))
    written = json.loads((run_dir / "eval-5.json").read_text())
    assert written["checkpoint"] == result["checkpoint"] == 5
    assert written["episodes"] == 1
    assert "checkpoint 5 (5,120 env steps): 1 episode, deterministic policy" in summary(result)
