"""An actor samples every step with a fresh key from one chain that runs across rollouts.

The reference replays the chain on its own: from `sampling_key(settings.key)`, step after
step, `key, sample_key = split(key)`, and the step's action is the policy's distribution at
the recorded observation sampled with `sample_key`. Both the step-by-step loop and the
compiled (fused) rollout must give exactly the reference's actions; a key that never
advances, or one that restarts every rollout, gives other actions, which the test checks it
can tell apart.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from podrace.actor import SAMPLING_PRNG, sampling_key
from podrace.config import EnvConfig, NetworkConfig
from podrace.envs.envpool_backend import EnvpoolEnv
from podrace.networks import make_network
from tests.helpers.actors import ROLLOUTS, envpool_envs, run_actor

NUM_ENVS, T = 8, 40  # a fused rollout of 40 steps runs as two calls (32 + 8)


def key_chain(raw_key: jax.Array, steps: int) -> list[jax.Array]:
    """The sample keys of `steps` consecutive actor steps."""
    key, out = sampling_key(raw_key), []
    for _ in range(steps):
        key, sample_key = jax.random.split(jax.random.wrap_key_data(key, impl=SAMPLING_PRNG))
        key = jax.random.key_data(key)
        out.append(sample_key)
    return out


def reference_actions(rollouts, sample_keys) -> np.ndarray:
    """[rollouts * T, envs] actions sampled at the recorded observations with `sample_keys`."""
    env = EnvpoolEnv(EnvConfig(id="CartPole-v1"), NUM_ENVS, seed=7)
    spec = env.spec
    env.close()
    net = make_network(NetworkConfig(), spec)
    params = net.init(jax.random.PRNGKey(1), np.zeros((1,) + spec.obs_shape, spec.obs_dtype))
    sample = jax.jit(lambda obs, key: net.apply(params, obs)[0].sample(key))
    obs = np.concatenate([np.asarray(r.trajectory.obs) for r in rollouts])
    return np.stack([np.asarray(sample(o, k)) for o, k in zip(obs, sample_keys)])


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "step-by-step"])
def test_every_step_samples_with_the_next_key_of_one_chain(fused):
    rollouts = run_actor(envpool_envs("CartPole-v1", NUM_ENVS), T, fused, NetworkConfig())
    assert [r.seq for r in rollouts] == list(range(ROLLOUTS))
    actions = np.concatenate([np.asarray(r.trajectory.actions) for r in rollouts])

    chain = key_chain(jax.random.PRNGKey(3), ROLLOUTS * T)
    np.testing.assert_array_equal(actions, reference_actions(rollouts, chain))

    frozen = [chain[0]] * len(chain)
    restarted = chain[:T] * ROLLOUTS
    for wrong in (frozen, restarted):
        assert (reference_actions(rollouts, wrong) != actions).mean() > 0.2
