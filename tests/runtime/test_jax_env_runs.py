"""Runs on envs written in JAX (thread topology): PPO and IMPALA with the envs on the actor's
device, and the reset rule of a resumed run (fresh envs, keys from the resume point)."""

from __future__ import annotations

import shutil

import jax
import numpy as np
import pytest

from podrace.checkpoints.resume import Resume
from podrace.checkpoints.state import checkpoint_dir
from podrace.envs import make_env
from podrace.runtime.build import actor_env_seed
from podrace.runtime.run import prepare, train
from tests.helpers.configs import small


def jax_envs_run(tmp_path, **changes):
    """`small` with 1 actor on device 1 whose 8 envs are gymnax's CartPole: 8 updates."""
    base = {
        "total_steps": 8 * 16 * 8,
        "env.id": "gymnax:CartPole-v1",
        "env.backend": "jax",
        "layout.actor_device_ids": (1,),
        "layout.actors_per_device": 1,
        "ppo.num_minibatches": 2,
    }
    return small(tmp_path, **{**base, **changes})


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"algo": "impala"},
        {"normalize.obs": True, "network.core": "lstm", "network.core_size": 16},
    ],
    ids=["ppo", "impala", "ppo-obs-normalized-lstm"],
)
def test_jax_envs_train_on_the_actor_device(tmp_path, changes):
    run = prepare(jax_envs_run(tmp_path, **changes))
    actor = run.actors[0]
    assert actor.fused is not None and actor.policy.device == run.devices.actors[0]
    assert actor.policy.device.id == 1
    result = run.run()
    assert result.updates == 8 and result.env_steps == 8 * 8 * 16
    # the envs' state lived on the actor's device, in its compiled rollout's carry
    leaves = jax.tree.leaves(actor.fused.carry.handle)
    assert leaves and all(leaf.devices() == {actor.policy.device} for leaf in leaves)
    assert result.final_eval is not None and len(result.final_eval.returns) == 2
    assert result.final_eval.mean_return > 0


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_resumed_run_resets_its_jax_envs_with_keys_of_the_resume_point(tmp_path):
    """The checkpoint holds no env state: a resumed run's actors reset their envs with keys
    derived from (run seed, actor, resume point), reproducibly, not the first run's."""
    cfg = jax_envs_run(tmp_path, **{"log.run_name": "a", "checkpoint.every_updates": 4})
    first = train(cfg)
    assert first.checkpoint == 8
    shutil.move(checkpoint_dir(first.run_dir) / "8", tmp_path / "8")
    resumed = prepare(None, resume=Resume(first.run_dir, step=4))
    env, first_obs = resumed.actors[0].env, []
    reset = env.reset
    env.reset = lambda: first_obs.append(reset()) or first_obs[-1]
    result = resumed.run()
    assert result.updates == 8 and len(first_obs) == 1

    def reset_obs(seed):
        return make_env(cfg.env, 8, seed).reset()

    np.testing.assert_array_equal(first_obs[0], reset_obs(actor_env_seed(cfg, 0, 4)))
    assert not np.array_equal(first_obs[0], reset_obs(actor_env_seed(cfg, 0, 0)))
