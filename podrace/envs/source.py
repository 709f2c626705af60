"""Where a run's envs come from: an env id through a backend, or the user's env factory.

An env factory is any callable `(num_envs, seed) -> BatchedEnv | gymnasium.vector.VectorEnv`.
A Gymnasium vector env is adapted (next-step autoreset, episode statistics, seeding of its
first reset); a BatchedEnv is used as it is. `EnvSource` is the one object a runtime needs:
`spec()` validates before any thread starts, `make()` builds envs for actors and evaluator.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium
import numpy as np

from podrace.config import ConfigError, EnvConfig
from podrace.envs.base import BatchedEnv, env_seeds
from podrace.envs.closing import close_envs
from podrace.envs.factory import env_spec, make_env
from podrace.envs.gymnasium_backend import dependency_checked
from podrace.envs.resolve import resolve_backend
from podrace.envs.spaces import ObsIndices
from podrace.envs.user_modules import import_failure, make_working_dir_importable
from podrace.envs.vector_adapter import VectorEnvAdapter
from podrace.types import EnvSpec, EnvStep

EnvFactory = Callable[[int, int], BatchedEnv | gymnasium.vector.VectorEnv]
"""(num_envs, seed) -> num_envs envs, deterministic given seed."""


def factory_name(factory: EnvFactory) -> str:
    return getattr(factory, "__qualname__", None) or type(factory).__name__


def factory_reference(factory: EnvFactory) -> str | None:
    """'module:qualname' that another process imports back to `factory` itself: a function
    or class at the top level of a module (or in a class there). None for what cannot be
    imported so: a lambda or closure, a partial or other instance, anything of `__main__`
    (a script run as a command, whose import would run it again)."""
    module = getattr(factory, "__module__", None)
    qualname = getattr(factory, "__qualname__", None)
    if not (isinstance(module, str) and isinstance(qualname, str)) or module == "__main__":
        return None
    found = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return f"{module}:{qualname}" if found is factory else None


def factory_record(factory: EnvFactory | None) -> dict | None:
    """What a run's checkpoints record of its env factory (None: envs from `cfg.env.id`):
    its name for messages, and its `factory_reference` (None when it cannot be imported)."""
    if factory is None:
        return None
    return {"name": factory_name(factory), "import": factory_reference(factory)}


class FactoryNotImportable(ConfigError):
    """A stored run's envs came from an env factory that this process cannot import."""


def import_factory(reference: str) -> EnvFactory:
    """The callable `reference` ('module:qualname') names; FactoryNotImportable (one line,
    naming the module and the error) when the module fails to import, in any way, or lacks it."""
    module, _, qualname = reference.partition(":")
    try:
        found = importlib.import_module(module)
    except (Exception, SystemExit) as error:  # the user's module: any error is its message
        raise FactoryNotImportable(
            f"its envs came from the env factory {reference!r}, whose module {module!r} "
            f"cannot be imported{import_failure(error)}"
        ) from None
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if not callable(found):
        raise FactoryNotImportable(
            f"its envs came from the env factory {reference!r}, which module {module!r} "
            "no longer defines"
        )
    return found


def from_factory(factory: EnvFactory, num_envs: int, seed: int) -> BatchedEnv:
    """`factory(num_envs, seed)` as a BatchedEnv; ConfigError (one line) for what cannot run."""
    name = factory_name(factory)
    made = dependency_checked(name, lambda: factory(num_envs, seed))
    try:
        if isinstance(made, gymnasium.vector.VectorEnv):
            env = VectorEnvAdapter(made, seed, name)
        elif isinstance(made, BatchedEnv):
            if not isinstance(made.spec, EnvSpec):
                raise ConfigError(
                    f"env factory {name!r}: BatchedEnv.spec must be a podrace.types.EnvSpec"
                )
            env = made
        else:
            hint = (
                " (wrap it: gymnasium.vector.SyncVectorEnv)"
                if isinstance(made, gymnasium.Env)
                else ""
            )
            raise ConfigError(
                f"env factory {name!r} returned {type(made).__name__}; expected a podrace "
                f"BatchedEnv or a gymnasium.vector.VectorEnv{hint}"
            )
        if env.num_envs != num_envs:
            raise ConfigError(
                f"env factory {name!r} was asked for {num_envs} envs and made {env.num_envs}"
            )
    except BaseException:
        if hasattr(made, "close"):
            close_envs(
                [(f"env factory {name!r}", made)]
            )  # user code: its failure must not hide this one
        raise
    return env


class KeptObservations:
    """A BatchedEnv whose observations keep only some entries (`EnvConfig.obs_indices` applied
    to the envs of a user's factory; the backends apply it themselves)."""

    def __init__(self, env: BatchedEnv, indices: tuple[int, ...], name: str) -> None:
        self.env = env
        self._select = ObsIndices(indices, env.spec.obs_shape, name)
        self.spec = self._select.spec(env.spec)
        self.num_envs = env.num_envs

    def reset(self):
        return self._select(self.env.reset())

    def step(self, actions) -> EnvStep:
        step = self.env.step(actions)
        return step._replace(obs=self._select(step.obs))

    def close(self) -> None:
        self.env.close()


@dataclass(frozen=True)
class EnvSource:
    """`cfg.id` through its backend, or `factory` when one is given (then `cfg.id` is unused).

    Picklable when the factory is (cloudpickle handles closures), so a Ray worker can
    build its own envs from it.
    """

    cfg: EnvConfig
    factory: EnvFactory | None = None

    def spec(self) -> EnvSpec:
        """Check the envs can be built and acted in; a factory is called once for a probe."""
        if self.factory is None:
            resolve_backend(self.cfg)
            return env_spec(self.cfg)
        if not callable(self.factory):
            raise ConfigError(f"env_factory must be callable, got {type(self.factory).__name__}")
        probe = self.make(self.cfg.num_envs, 0)
        try:
            return probe.spec
        finally:
            close_envs(
                [(f"env factory {factory_name(self.factory)!r} (spec probe)", probe)]
            )  # user code

    def make(self, num_envs: int, seed: int, threads: int | None = None) -> BatchedEnv:
        """`num_envs` envs, deterministic given `seed` (a non-negative int); `threads` is
        the envpool worker count when `cfg.num_threads` leaves it open (None: envpool's)."""
        if self.factory is None:
            cfg = (
                self.cfg
                if self.cfg.num_threads is not None
                else dataclasses.replace(self.cfg, num_threads=threads)
            )
            return make_env(cfg, num_envs, seed)
        if num_envs <= 0:
            raise ConfigError(f"num_envs must be positive, got {num_envs}")
        return self._from_factory(num_envs, seed)

    def _from_factory(self, num_envs: int, seed: int) -> BatchedEnv:
        """The factory's envs, keeping only `cfg.obs_indices` of the observation if set."""
        env = from_factory(self.factory, num_envs, seed)
        if self.cfg.obs_indices is None:
            return env
        try:
            return KeptObservations(env, self.cfg.obs_indices, factory_name(self.factory))
        except BaseException:
            close_envs([(f"env factory {factory_name(self.factory)!r}", env)])  # user code
            raise

    def make_part(
        self, num_envs: int, seed: int, part: range, threads: int | None = None
    ) -> BatchedEnv:
        """Envs `part` of the `num_envs` that `make(num_envs, seed)` builds, on their own
        (an env worker process steps a part of an actor's envs): through a backend each env
        gets the seed it has there, so the parts together step exactly the same episodes.
        A factory cannot be given per-env seeds: it is called with a seed derived from
        `seed` and the part's first env (reproducible, but other episodes)."""
        if not (0 <= part.start < part.stop <= num_envs and part.step == 1):
            raise ValueError(f"part {part} is not a range of envs of {num_envs}")
        if self.factory is None and len(part) == num_envs:
            return self.make(num_envs, seed, threads)
        if self.factory is None:
            cfg = (
                self.cfg
                if self.cfg.num_threads is not None
                else dataclasses.replace(self.cfg, num_threads=threads)
            )
            seeds = env_seeds(seed, num_envs)[part.start : part.stop]
            return make_env(cfg, len(part), seed, seeds)
        if len(part) == num_envs:
            return self._from_factory(num_envs, seed)
        derived = np.random.SeedSequence([seed, part.start]).generate_state(1)[0] & 0x7FFFFFFF
        return self._from_factory(len(part), int(derived))


def stored_env_source(
    cfg: EnvConfig, record: dict | None, given: EnvSource | None = None
) -> EnvSource:
    """Where a stored run's envs come from when it is resumed or evaluated: `given` (a
    caller's), else the env factory the run recorded, imported (a module of the working
    directory too, as for a `module:EnvId` id), else `cfg.id`. FactoryNotImportable when
    the run recorded a factory that cannot be imported: `cfg.id` was never its env."""
    if given is not None or record is None:
        return given or EnvSource(cfg)
    reference = record["import"]
    if reference is None:
        raise FactoryNotImportable(
            f"its envs came from the env factory {record['name']!r}, which podrace cannot "
            "import (only a function or class defined at the top level of an importable "
            "module can be, not one defined inside a function or in a script run as __main__)"
        )
    make_working_dir_importable(reference)
    return EnvSource(cfg, import_factory(reference))
