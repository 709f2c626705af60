"""Publisher-side transforms: keep a sub-tree, cast dtypes. Run once per version.

Pass one (or `compose(...)` of several) as a publisher's `transform`. They are plain
pytree functions, usable on JAX arrays (staying on the learner's devices) or NumPy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from podrace.sync.base import PyTree

Transform = Callable[[PyTree], PyTree]


def select(*path: Any) -> Transform:
    """Keep the sub-tree at `path` (dict keys, sequence indices or attribute names).

    E.g. `select("params", "policy")` publishes only the policy head's parameters.
    """

    def pick(tree: PyTree) -> PyTree:
        for key in path:
            if isinstance(key, str) and not isinstance(tree, dict) and hasattr(tree, key):
                tree = getattr(tree, key)
            else:
                tree = tree[key]
        return tree

    return pick


def cast(dtype: Any, floating_only: bool = True) -> Transform:
    """Cast leaves to `dtype` (by default only floating-point leaves), e.g. to bfloat16."""
    target = np.dtype(dtype)

    def convert(tree: PyTree) -> PyTree:
        def one(x: Any) -> Any:
            if not hasattr(x, "dtype"):  # a Python scalar leaf
                x = np.asarray(x)
            if floating_only and not np.issubdtype(np.dtype(x.dtype), np.floating):
                return x
            return x.astype(target)

        return jax.tree_util.tree_map(one, tree)

    return convert


def compose(*transforms: Transform) -> Transform:
    """Apply `transforms` left to right."""

    def run(tree: PyTree) -> PyTree:
        for transform in transforms:
            tree = transform(tree)
        return tree

    return run
