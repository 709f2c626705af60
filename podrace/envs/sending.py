"""Sending what builds envs to other processes (env worker processes, Ray workers): a
`WorkerSpec` pickled with its env factory, or a one-line ConfigError saying why the factory
cannot go and what the user can do instead."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

from podrace.config import ConfigError
from podrace.envs.source import EnvSource, factory_name
from podrace.envs.worker_protocol import WorkerSpec


@dataclass(frozen=True)
class Destination:
    """Processes an env factory is sent to."""

    name: str
    """Named in the error: "cannot be sent to <name>"."""
    instead: str
    """What the user can do otherwise (run without those processes)."""
    pickler: Any = None
    """A module with `dumps`, the one the transport uses; None: cloudpickle when installed
    (a factory that cannot be imported by its name there, such as a closure, a lambda or one
    defined in the script run as `__main__`, goes by value), else `pickle` (only an
    importable factory can go)."""


ENV_WORKERS = Destination("env worker processes", "use --env.workers 0")


def pickled(spec: WorkerSpec, to: Destination = ENV_WORKERS) -> bytes:
    """`spec` pickled for the processes `to`; ConfigError if its env factory cannot go."""
    factory = spec.source.factory
    pickler = to.pickler
    if pickler is None:
        try:
            import cloudpickle as pickler
        except ImportError:
            if getattr(factory, "__module__", None) == "__main__":
                raise ConfigError(
                    "the env factory is defined in the script run as __main__, which "
                    f"{to.name} cannot import: define it in a module, install cloudpickle, or "
                    f"{to.instead}"
                ) from None
            pickler = pickle
    try:
        return pickler.dumps(spec)
    except Exception as error:  # noqa: BLE001 - any pickling failure is the user's factory
        lines = str(error).strip().splitlines()
        raise ConfigError(
            f"the env factory {factory_name(factory)!r} cannot be sent to {to.name} "
            f"({type(error).__name__}: {lines[0] if lines else ''}); define it at module "
            f"level, or {to.instead}"
        ) from None


def check_sendable(source: EnvSource, to: Destination = ENV_WORKERS) -> None:
    """ConfigError now (before anything starts) if `source`'s env factory cannot reach the
    processes `to`."""
    if source.factory is not None:
        pickled(WorkerSpec(source, 1, 0, range(1), None, None), to)


__all__ = ["ENV_WORKERS", "Destination", "check_sendable", "pickled"]
