"""Defer importing a module until something reads one of its attributes.

gymnax imports matplotlib's pyplot and seaborn at the top of its environment modules,
to render (Pong, Catch and a few others), which a training run never does: on a shared
2-core machine those imports (seaborn brings scipy.stats and pandas) took about 80% of
`import gymnax`'s 3 CPU seconds. While such a package is imported, `defer` puts a
stand-in for each named module in `sys.modules`; the stand-in imports the real module the
first time one of its attributes is read (a render) and hands that attribute on, so the
code holding it works as before, only later.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterable
from typing import Any


class _OnFirstUse(types.ModuleType):
    """Stands in `sys.modules` for a module not imported yet: reading an attribute it does
    not have imports the real module (replacing the stand-in there) and reads it there."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        # `import name` on a module found in sys.modules reads its spec (is it importing?)
        self.__spec__ = importlib.machinery.ModuleSpec(name, None)

    def __getattr__(self, attr: str) -> Any:
        name = self.__name__
        if sys.modules.get(name) is self:
            del sys.modules[name]
        return getattr(importlib.import_module(name), attr)


def defer(names: Iterable[str]) -> None:
    """Stand-ins (`_OnFirstUse`) for the modules `names` that are installed and not imported
    yet; a name whose top-level package is missing is left alone (its import fails as it
    would have)."""
    for name in names:
        if name in sys.modules or importlib.util.find_spec(name.partition(".")[0]) is None:
            continue
        sys.modules[name] = _OnFirstUse(name)
