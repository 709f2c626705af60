"""Gymnasium spaces -> EnvSpec, a backend's observations -> the spec's, and policy
actions -> what a backend accepts.

Both backends describe themselves with Gymnasium spaces (envpool's gymnasium API too), so
one translation serves both.
"""

from __future__ import annotations

import gymnasium
import numpy as np

from podrace.config import ConfigError
from podrace.control import ExplainedError
from podrace.types import EnvSpec

SUPPORTED = (
    "supported: Box or Discrete observations; Discrete actions starting at 0, "
    "or a 1-D Box of float actions"
)


def spec_from_spaces(
    env_id: str, obs_space: gymnasium.Space, action_space: gymnasium.Space
) -> EnvSpec:
    """EnvSpec of one (unbatched) env; ConfigError for spaces podrace cannot act in.

    The error names the offending space and lists what is supported, so a user with a
    Dict observation or a MultiDiscrete action knows what to wrap or flatten.
    """
    if isinstance(obs_space, gymnasium.spaces.Box):
        obs_shape, obs_dtype = tuple(obs_space.shape), np.dtype(obs_space.dtype)
        if obs_dtype == np.bool_:  # binary planes (MinAtar): uint8 0/1, which JAX and
            obs_dtype = np.dtype(np.uint8)  # shared-memory buffers take as numbers
    elif isinstance(obs_space, gymnasium.spaces.Discrete):  # one-hot (OneHotObs)
        obs_shape, obs_dtype = (int(obs_space.n),), np.dtype(np.float32)
    else:
        raise ConfigError(
            f"env {env_id!r}: unsupported observation space {obs_space} ({SUPPORTED})"
        )

    if isinstance(action_space, gymnasium.spaces.Discrete):
        if int(action_space.start) != 0:
            raise ConfigError(
                f"env {env_id!r}: discrete actions must start at 0, got {action_space} "
                f"({SUPPORTED})"
            )
        return EnvSpec(obs_shape, obs_dtype, int(action_space.n), ())
    if isinstance(action_space, gymnasium.spaces.Box) and len(action_space.shape) == 1:
        # A Gaussian policy samples floats; an integer Box would silently truncate them.
        if not np.issubdtype(action_space.dtype, np.floating):
            raise ConfigError(
                f"env {env_id!r}: Box action space with integer dtype {action_space.dtype} is not "
                f"supported; use Discrete for integer actions ({SUPPORTED})"
            )
        return EnvSpec(
            obs_shape,
            obs_dtype,
            None,
            tuple(action_space.shape),
            np.array(action_space.low, copy=True),
            np.array(action_space.high, copy=True),
        )
    raise ConfigError(f"env {env_id!r}: unsupported action space {action_space} ({SUPPORTED})")


class ObservationOutsideSpace(ExplainedError, ValueError):
    """An env gave a Discrete observation its own space does not hold (its bug, not podrace's:
    no traceback of podrace's frames helps)."""


class OneHotObs:
    """A Discrete observation (a state's index: FrozenLake, Taxi) as a one-hot float32
    vector, as the spec describes it. Fed to a network as a number, state 7 is "more" than
    state 6 and a policy can hardly tell states apart (PPO on FrozenLake-v1, 300k steps:
    eval return 0.0-0.1, one-hot 0.5-0.8), and statistics of indices mean nothing."""

    def __init__(self, space: gymnasium.spaces.Discrete) -> None:
        self.n, self.start = int(space.n), int(space.start)

    @staticmethod
    def of(space: gymnasium.Space) -> OneHotObs | None:
        """The encoder for `space`; None where observations are used as they are (a Box)."""
        return OneHotObs(space) if isinstance(space, gymnasium.spaces.Discrete) else None

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """[*batch] indices -> a new [*batch, n] float32 array; ValueError for an index
        outside the space (the env broke its own contract)."""
        index = np.asarray(obs).astype(np.int64) - self.start
        if index.size and (index.min() < 0 or index.max() >= self.n):
            outside = np.unique(index[(index < 0) | (index >= self.n)] + self.start)
            more = f" and {outside.size - 3} other values" if outside.size > 3 else ""
            raise ObservationOutsideSpace(
                f"the env's observations must be in [{self.start}, {self.start + self.n}) as its "
                f"Discrete({self.n}, start={self.start}) says, got {outside[:3].tolist()}{more}"
            )
        return (index[..., None] == np.arange(self.n)).astype(np.float32)

    def jax(self, obs):
        """The same inside a jitted function (an index outside the space gives zeros)."""
        import jax

        return jax.nn.one_hot(obs.astype("int32") - self.start, self.n, dtype="float32")


class ObsIndices:
    """Keeps the entries `indices` of each vector observation, in that order
    (`EnvConfig.obs_indices`): an env made partially observed, e.g. CartPole without its
    velocities. Both backends apply it where they return observations (inside compiled
    rollouts too), after a Discrete observation became one-hot."""

    def __init__(self, indices: tuple[int, ...], obs_shape: tuple[int, ...], env_id: str) -> None:
        if len(obs_shape) != 1:
            raise ConfigError(
                f"env.obs_indices keeps entries of a vector observation; env {env_id!r} has "
                f"observations of shape {tuple(obs_shape)}"
            )
        size = obs_shape[0]
        if not indices or any(not 0 <= i < size for i in indices):
            raise ConfigError(
                f"env.obs_indices must be indices in [0, {size}) of env {env_id!r}'s observation "
                f"of {size} entries, got {list(indices)}"
            )
        self.indices = np.asarray(indices, np.intp)

    @staticmethod
    def of(indices: tuple[int, ...] | None, spec: EnvSpec, env_id: str) -> ObsIndices | None:
        """The selection for observations `spec` describes (before it); None keeps them whole."""
        return None if indices is None else ObsIndices(indices, spec.obs_shape, env_id)

    def spec(self, spec: EnvSpec) -> EnvSpec:
        """`spec` with the observations this selection leaves."""
        return spec._replace(obs_shape=(len(self.indices),))

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """[*batch, n] -> a new [*batch, len(indices)] array."""
        return np.take(obs, self.indices, axis=-1)

    def jax(self, obs):
        """The same inside a jitted function."""
        return obs[..., self.indices]


class ActionPreparer:
    """Checks a batch of policy actions and converts it to the backend's dtype.

    Continuous actions are clipped here, into a new array, so the learner keeps the
    unclipped sample its log-probabilities belong to. Discrete actions are range-checked:
    an out-of-range index would otherwise index past the action set inside a C++ backend.
    """

    def __init__(self, spec: EnvSpec, num_envs: int, dtype: np.dtype) -> None:
        self._spec = spec
        self._shape = (num_envs, *spec.action_shape)
        self._dtype = np.dtype(dtype)

    def __call__(self, actions: np.ndarray) -> np.ndarray:
        actions = np.asarray(actions)
        if actions.shape != self._shape:
            raise ValueError(f"expected actions of shape {self._shape}, got {actions.shape}")
        if self._spec.discrete:
            if not np.issubdtype(actions.dtype, np.integer):
                raise ValueError(f"discrete actions must be integers, got dtype {actions.dtype}")
            if actions.size and (actions.min() < 0 or actions.max() >= self._spec.num_actions):
                raise ValueError(
                    f"discrete actions must be in [0, {self._spec.num_actions}), "
                    f"got {actions.tolist()}"
                )
            return actions.astype(self._dtype, copy=False)
        clipped = np.clip(actions, self._spec.action_low, self._spec.action_high)
        return clipped.astype(self._dtype, copy=False)
