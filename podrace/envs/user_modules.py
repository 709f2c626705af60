"""`module:EnvId` env ids (Gymnasium's convention): import the module, then use the id.

The full string stays in the config, so every process that builds envs from it (actor
threads, Ray workers, a resumed run) imports the module again before looking the id up.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

from podrace.config import ConfigError
from podrace.envs.minatar import is_minatar_id, register_minatar


def split_env_id(env_id: str) -> tuple[str | None, str]:
    """('my_module', 'MyEnv-v0') for 'my_module:MyEnv-v0'; (None, env_id) without a module."""
    module, sep, name = env_id.rpartition(":")
    if not sep:
        return None, env_id
    if not module or not name:
        raise ConfigError(f"env.id {env_id!r} must be 'module:EnvId' or a registered env id")
    return module, name


def import_failure(error: BaseException) -> str:
    """One line for an exception raised while a user's module was imported: where it was
    raised (the innermost frame, or the line a SyntaxError names) and what it was."""
    if isinstance(error, SyntaxError):
        where, what = (error.filename, error.lineno), error.msg
    else:
        frames = traceback.extract_tb(error.__traceback__)
        where, what = (frames[-1].filename, frames[-1].lineno) if frames else (None, None), error
    text = " ".join(f"{type(error).__name__}: {what}".split())
    text = text if len(text) <= 300 else f"{text[:297]}..."
    return f" ({where[0]}, line {where[1]}): {text}" if where[0] else f": {text}"


def import_env_module(env_id: str) -> str:
    """Import the module named by `env_id` (if any) so it can register its envs, or register
    a family podrace knows by its id (`MinAtar/...`); returns the id without the module part.

    A module that cannot be imported is a config error, one line: a missing module, or any
    exception the module raises (SystemExit included: it must not end podrace), named with
    the line that raised it.
    """
    module, name = split_env_id(env_id)
    if module is None and is_minatar_id(name):
        register_minatar(name)
    if module is not None:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:
            raise ConfigError(
                f"env.id {env_id!r}: cannot import module {module!r} ({error})"
            ) from None
        except (Exception, SystemExit) as error:  # the user's module: any error is its own
            raise ConfigError(
                f"env.id {env_id!r}: importing module {module!r} failed{import_failure(error)}"
            ) from None
    return name


def make_working_dir_importable(env_id: str) -> None:
    """Let `my_module:MyEnv-v0` find my_module.py in the working directory, as `python -m`
    would (the `podrace` script's own folder is first on sys.path instead). Every command
    that builds envs from a config (train, --resume, eval) calls it before resolving the id."""
    if ":" not in env_id or "" in sys.path:
        return
    try:
        cwd = os.getcwd()
    except OSError:  # the working directory was deleted: nothing to import from it
        return
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
