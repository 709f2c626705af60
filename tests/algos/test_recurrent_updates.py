"""Recurrent updates: minibatches are whole env sequences with their stamped states, never
cut across time (PPO's epochs deal the envs again each epoch)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podrace.algos.base import RecurrentApply
from podrace.algos.distributions import Categorical
from podrace.algos.impala import make_impala
from podrace.algos.ppo import make_ppo
from podrace.config import ImpalaConfig, PPOConfig
from podrace.types import Trajectory

T, B = 5, 8


def recording_apply(seen: list) -> RecurrentApply:
    """A stand-in network that records the sequences (obs) and start states each loss call
    unrolls: obs[t, e] = (t, env id), the state of env e = its id."""

    def record(obs, state):
        seen.append((np.asarray(obs), np.asarray(state)))

    def unroll(params, obs, valid, state):
        jax.debug.callback(record, obs, state)
        steps, batch = obs.shape[:2]
        logits = params["w"] * jnp.stack([obs[..., 0], -obs[..., 0]], axis=-1)
        return Categorical(logits), params["w"] * obs[..., 1], jnp.zeros((steps, batch, 1))

    return RecurrentApply(unroll, lambda batch: np.zeros((batch, 1), np.float32))


def trajectory() -> Trajectory:
    t, e = np.meshgrid(np.arange(T), np.arange(B), indexing="ij")
    obs = np.stack([t, e], axis=-1).astype(np.float32)
    f, b = np.zeros((T, B), np.float32), np.ones((T, B), bool)
    return Trajectory(
        obs,
        np.zeros((T, B), np.int32),
        np.full((T, B), np.log(0.5), np.float32),
        f,
        np.ones((T, B), np.float32),
        ~b,
        ~b,
        b,
        obs[-1],
        f[0],
        core_state=np.arange(B, dtype=np.float32)[:, None],
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("algo_name", ["ppo", "impala"])
def test_minibatches_are_whole_env_sequences_with_their_states(algo_name):
    seen: list = []
    apply = recording_apply(seen)
    if algo_name == "ppo":
        cfg, epochs = PPOConfig(num_epochs=3, num_minibatches=4), 3
        algo = make_ppo(cfg, apply, num_updates=1, axis_name=None)
    else:
        cfg, epochs = ImpalaConfig(num_minibatches=4), 1
        algo = make_impala(cfg, apply, num_updates=1, axis_name=None)
    keys = jax.random.split(jax.random.PRNGKey(0), B)
    state, _ = jax.jit(algo.update)(algo.init({"w": jnp.ones(())}), trajectory(), keys)
    jax.block_until_ready(state)
    jax.effects_barrier()
    assert len(seen) == epochs * 4
    orders = []
    for epoch in range(epochs):
        envs = []
        for obs, core in seen[epoch * 4 : (epoch + 1) * 4]:
            steps = obs.shape[0] - (algo_name == "impala")  # IMPALA adds the bootstrap step
            assert steps == T and obs.shape[1] == B // 4
            for j in range(obs.shape[1]):
                env = int(obs[0, j, 1])
                np.testing.assert_array_equal(obs[:T, j, 0], np.arange(T))  # all of its time
                np.testing.assert_array_equal(obs[:T, j, 1], env)  # one env
                assert core[j, 0] == env  # with its own start state
                envs.append(env)
        assert sorted(envs) == list(range(B))  # every env once per epoch
        orders.append(envs)
    if algo_name == "ppo":  # dealt again every epoch
        assert len({tuple(order) for order in orders}) > 1
