"""One batched, next-step-autoreset env interface over envpool, Gymnasium and user factories.

Host-side NumPy only (no JAX): the actor is the only caller of `step`.
"""

import contextlib
import warnings
from collections.abc import Iterator

from podrace.envs.base import BatchedEnv, env_seeds
from podrace.envs.factory import env_spec, make_env
from podrace.envs.resolve import resolve_backend
from podrace.envs.source import EnvFactory, EnvSource, from_factory
from podrace.envs.vector_adapter import VectorEnvAdapter


def silence_env_warnings() -> None:
    """What podrace silences, for the CLI's commands (for good) and a library run (while
    it runs, `env_warnings_silenced`): envpool's float64 Box bounds cast to float32 and
    Gymnasium's "environment is out of date" notes are multi-line, coloured noise ahead of
    podrace's one-line messages (the config names the env version the user asked for)."""
    warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")
    warnings.filterwarnings("ignore", message=r".*The environment \S+ is out of date")


@contextlib.contextmanager
def env_warnings_silenced() -> Iterator[None]:
    """`silence_env_warnings` for the body of the `with` (every thread: Python's warning
    filters are the process's), the caller's filters restored after."""
    with warnings.catch_warnings():
        silence_env_warnings()
        yield


__all__ = [
    "BatchedEnv",
    "EnvFactory",
    "EnvSource",
    "VectorEnvAdapter",
    "env_seeds",
    "env_spec",
    "env_warnings_silenced",
    "from_factory",
    "make_env",
    "resolve_backend",
    "silence_env_warnings",
]
