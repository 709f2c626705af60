"""The package's import graph: no cycles, and no module imports one that sits above it.

Every import counts, also those inside functions (a lazy import is still a dependency:
it only hides the cycle from the interpreter), and for cycles also those made only for
annotations (`if TYPE_CHECKING:`): a module that names another's types depends on it.
The layers, lowest first, follow the data flow and the runtime sitting on top of it: a
module may import its own layer and those below.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

PACKAGE = Path(__file__).resolve().parents[1] / "podrace"

LAYERS: list[tuple[str, ...]] = [
    # data, configuration, the control primitives every loop may use, wording of counts
    (
        "podrace.types",
        "podrace.json_text",
        "podrace.config",
        "podrace.config_dict",
        "podrace.control",
        "podrace.wording",
        "podrace.compile_once",
        "podrace.pbt.config",
    ),
    ("podrace.validation", "podrace.presets", "podrace.pbt.validation"),
    # building blocks: envs, networks, pure algorithms, weight sync, metrics
    (
        "podrace.envs",
        "podrace.networks",
        "podrace.algos",
        "podrace.sync",
        "podrace.metrics",
        "podrace.pbt",
    ),
    # the loops: actor -> pipeline -> learner -> (sync) -> actor, and the evaluator
    ("podrace.fused_rollout", "podrace.actor", "podrace.inference", "podrace.pipeline"),
    ("podrace.learner_mesh", "podrace.learner", "podrace.evaluate", "podrace.video"),
    # the run directory (checked by a resume) and what a checkpoint holds
    ("podrace.rundir", "podrace.checkpoints"),
    # where things run: the run skeleton, its builders and the topologies
    ("podrace.runtime",),
    # the commands, with the process supervision they need
    ("podrace.commands", "podrace.cli"),
    ("podrace",),  # the package's lazy public API
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:` (annotations only: no import at run time)."""
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _nodes(tree: ast.AST, annotations: bool):
    """Every node of `tree`; those under `if TYPE_CHECKING:` only with `annotations`."""
    for child in ast.iter_child_nodes(tree):
        if _type_checking_only(child) and not annotations:
            continue
        yield child
        yield from _nodes(child, annotations)


def imports_of(path: Path, modules: set[str], annotations: bool = False) -> set[str]:
    """Every podrace module `path` imports, at any depth of its code (`annotations`: also
    those under `if TYPE_CHECKING:`)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _nodes(ast.parse(path.read_text(), str(path)), annotations):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from podrace.x import y` names the module podrace.x.y where there is one
            named = {f"{base}.{alias.name}" for alias in node.names} & modules
            found.update(named or {base})
    return {m for m in found if m in modules}


def graph(annotations: bool = False) -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {
        name: imports_of(path, set(paths), annotations) - {name} for name, path in paths.items()
    }


def layer_of(module: str) -> int:
    best, rank = -1, None
    for index, layer in enumerate(LAYERS):
        for prefix in layer:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), index
    assert rank is not None, f"{module} is in no layer of tests/test_layout.py"
    return rank


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_cycle():
    assert cycles(graph()) == []


def test_no_import_cycle_through_annotations():
    """The package's lazy API (`podrace/__init__.py`) names every public type for
    annotations and imports nothing at run time: it is the one module left out."""
    edges = graph(annotations=True)
    edges["podrace"] = graph()["podrace"]
    assert cycles(edges) == []


def test_no_module_imports_one_from_a_layer_above():
    upward = [
        f"{a} -> {b}"
        for a, targets in sorted(graph().items())
        for b in sorted(targets)
        if layer_of(b) > layer_of(a) and not (a == "podrace" or b.startswith(a + "."))
    ]
    assert upward == []


def test_the_checks_see_a_cycle_and_an_upward_import():
    """The two checks above would fail on what they look for."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
    assert layer_of("podrace.runtime.run") > layer_of("podrace.actor")
