"""Random trajectories of a given shape for learner tests (values are arbitrary but seeded)."""

import jax
import numpy as np

from podrace.config import NetworkConfig
from podrace.networks import initial_core_state
from podrace.types import Trajectory

ROLLOUT_LENGTH, ENVS = 8, 8
"""The shape of `actor_trajectory`'s rollouts: steps, envs."""


def random_trajectory(
    rng: np.random.Generator, spec, steps: int, envs: int, core_state=()
) -> Trajectory:
    """`core_state`: a recurrent core's state shaped like the stamp ([envs, ...] per leaf),
    filled with random values; () for a feed-forward policy."""
    obs = rng.normal(size=(steps, envs) + spec.obs_shape).astype(np.float32)
    return Trajectory(
        obs=obs,
        actions=rng.integers(0, spec.num_actions, size=(steps, envs)).astype(np.int32),
        logprobs=np.log(rng.uniform(0.3, 0.7, size=(steps, envs))).astype(np.float32),
        values=rng.normal(size=(steps, envs)).astype(np.float32),
        rewards=rng.normal(size=(steps, envs)).astype(np.float32),
        terminated=rng.uniform(size=(steps, envs)) < 0.1,
        truncated=rng.uniform(size=(steps, envs)) < 0.05,
        valid=rng.uniform(size=(steps, envs)) < 0.9,
        last_obs=obs[-1],
        last_value=rng.normal(size=(envs,)).astype(np.float32),
        core_state=jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), core_state),
    )


def actor_trajectory(
    rng: np.random.Generator, spec, network: NetworkConfig | None = None
) -> Trajectory:
    """A random rollout of one actor: ROLLOUT_LENGTH steps of ENVS envs, with the initial
    state of `network`'s core (the default network: none)."""
    core = initial_core_state(network or NetworkConfig(), ENVS)
    return random_trajectory(rng, spec, ROLLOUT_LENGTH, ENVS, core)
