"""Tree structure, shapes and dtypes of a params pytree, to reject mismatched snapshots early."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from podrace.sync.base import SnapshotMismatch, SyncError


@dataclass(frozen=True)
class TreeSpec:
    """What a consumer expects: the treedef plus one (shape, dtype) per leaf.

    Picklable (the shm transport stores it next to the data), so a reader in another
    process can rebuild the tree without being told its layout.
    """

    treedef: Any
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype, ...]

    @classmethod
    def of(cls, tree: Any) -> TreeSpec:
        """Spec of a pytree of arrays, ShapeDtypeStructs or scalars (reads metadata only)."""
        if isinstance(tree, TreeSpec):
            return tree
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        shapes, dtypes = [], []
        for leaf in leaves:
            if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
                leaf = np.asarray(leaf)
            shapes.append(tuple(int(d) for d in leaf.shape))
            dtypes.append(np.dtype(leaf.dtype))
        return cls(treedef, tuple(shapes), tuple(dtypes))

    @property
    def nbytes(self) -> int:
        return int(sum(int(np.prod(s)) * d.itemsize for s, d in zip(self.shapes, self.dtypes)))

    def check(self, tree: Any, what: str = "snapshot") -> None:
        """Raise SnapshotMismatch naming the first difference between `tree` and this spec."""
        self.check_spec(TreeSpec.of(tree), what)

    def check_spec(self, got: TreeSpec, what: str = "snapshot") -> None:
        if got.treedef != self.treedef:
            raise SnapshotMismatch(
                f"{what} tree structure differs: expected {self.treedef}, got {got.treedef}"
            )
        for i, (es, gs, ed, gd) in enumerate(zip(self.shapes, got.shapes, self.dtypes, got.dtypes)):
            if es != gs or ed != gd:
                path = _leaf_paths(self.treedef)[i]
                raise SnapshotMismatch(
                    f"{what} leaf {path}: expected {ed.name}{list(es)}, got {gd.name}{list(gs)}"
                )

    def check_fixed_size(self, what: str) -> None:
        """SnapshotMismatch for a leaf of Python objects, which cannot be copied as bytes."""
        for path, dtype in zip(_leaf_paths(self.treedef), self.dtypes):
            if dtype.hasobject:
                raise SnapshotMismatch(
                    f"{what} leaf {path}: dtype {dtype} holds Python objects, which cannot be put "
                    "in shared memory (publish arrays of numbers, bools or fixed-size strings)"
                )


class FirstLayout:
    """The tree structure, shapes and dtypes of the first version a publisher takes: a later
    version that differs is a SnapshotMismatch in every transport (shm's slots are laid out
    once; readers in other processes rebuild trees from it), so no reader ever sees a layout
    change that one transport would carry and another would not.

    Checked on the learner's thread at every publish, so a match costs one flatten and a
    tuple comparison (about 8 us for an actor-critic MLP's params; a TreeSpec takes 17 us)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._first: tuple | None = None
        self._first_spec: TreeSpec | None = None
        self._lock = threading.Lock()

    def check(self, tree: Any) -> None:
        """SnapshotMismatch unless `tree` (or a TreeSpec) has the first one's layout."""
        key = _layout_key(tree)
        with self._lock:
            if self._first is None:
                self._first, self._first_spec = key, TreeSpec.of(tree)
                return
            if key == self._first:
                return
        self._first_spec.check_spec(TreeSpec.of(tree), self.what)  # names the first difference


def _layout_key(tree: Any) -> tuple:
    """(treedef, ((shape, dtype), ...)): what FirstLayout compares."""
    if isinstance(tree, TreeSpec):
        return tree.treedef, tuple(zip(tree.shapes, tree.dtypes))
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, tuple(
        (leaf.shape, leaf.dtype)
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype")
        else (np.shape(leaf), np.asarray(leaf).dtype)
        for leaf in leaves
    )


def unreadable_tree(what: str, exc: BaseException) -> SyncError:
    """The error of a reader that cannot rebuild the params' tree from another program."""
    return SyncError(
        f"{what}: cannot rebuild the params tree in this process ({type(exc).__name__}: "
        f"{str(exc).splitlines()[0] if str(exc) else ''}). Its node types travel by reference, so "
        "the reader must be able to import them: define them in a module (not in the "
        "publisher's __main__ script), or publish plain dicts/lists "
        "(e.g. transform=select('params'))."
    )


def _leaf_paths(treedef: Any) -> list[str]:
    """Readable key paths of a treedef's leaves, for error messages."""
    dummy = jax.tree_util.tree_unflatten(treedef, list(range(treedef.num_leaves)))
    flat, _ = jax.tree_util.tree_flatten_with_path(dummy)
    return [jax.tree_util.keystr(path) or "<root>" for path, _ in flat]
