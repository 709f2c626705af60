"""One batched, next-step-autoreset env interface over envpool, Gymnasium and user factories.

Host-side NumPy only (no JAX): the actor is the only caller of `step`.
"""

from podrace.envs.base import BatchedEnv, env_seeds
from podrace.envs.factory import env_spec, make_env
from podrace.envs.resolve import resolve_backend
from podrace.envs.source import EnvFactory, EnvSource, from_factory
from podrace.envs.vector_adapter import VectorEnvAdapter

__all__ = [
    "BatchedEnv",
    "EnvFactory",
    "EnvSource",
    "VectorEnvAdapter",
    "env_seeds",
    "env_spec",
    "from_factory",
    "make_env",
    "resolve_backend",
]
