"""One batched, next-step-autoreset env interface over envpool and Gymnasium.

Host-side NumPy only (no JAX): the actor is the only caller of `step`.
"""

from podrace.envs.base import BatchedEnv, env_seeds
from podrace.envs.factory import env_spec, make_env
from podrace.envs.resolve import resolve_backend

__all__ = ["BatchedEnv", "env_seeds", "env_spec", "make_env", "resolve_backend"]
