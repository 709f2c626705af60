"""The suite's own structure: a test module takes what it shares from helper modules
(tests/helpers/, conftest.py fixtures, the non-test modules beside it), never from another
test module, so that a test module can be moved, split or changed without breaking
another."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# An import statement naming a test module, in code or in the Python source of a script a
# test runs in a subprocess (so a text search, not only the syntax tree).
_TEST_MODULE = r"tests(?:\.\w+)*\.test_\w+"
IMPORTS_OF_TEST_MODULES = re.compile(
    rf"^\s*(?:from\s+{_TEST_MODULE}\s+import\b|import\s+{_TEST_MODULE}\b"
    rf"|from\s+tests(?:\.\w+)*\s+import\s+(?:\(\s*)?test_\w+)",
    re.MULTILINE,
)


def imports_of_test_modules(source: str) -> list[str]:
    """The lines of `source` that import a test module (`tests/**/test_*.py`)."""
    found = [m.group(0).strip() for m in IMPORTS_OF_TEST_MODULES.finditer(source)]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tests"):
            names = [node.module + "." + alias.name for alias in node.names]
            modules = [node.module] + names
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        found += [
            f"line {node.lineno}: {name}"
            for name in modules
            if name.startswith("tests.")
            and name.rpartition(".")[2].startswith("test_")
            and (TESTS.parent / (name.replace(".", "/") + ".py")).exists()
        ]
    return found


def test_no_test_module_imports_another_test_module():
    offenders = {
        str(path.relative_to(TESTS.parent)): lines
        for path in sorted(TESTS.rglob("*.py"))
        if (lines := imports_of_test_modules(path.read_text()))
    }
    assert offenders == {}, "move what they share into tests/helpers/"


@pytest.mark.parametrize(
    "source",
    [
        "from tests.runtime.test_single_host import small\n",
        "def f():\n    from tests.test_cli import run_cli\n",
        "import tests.commands.test_eval\n",
        "from tests.runtime import test_multihost\n",
        'SCRIPT = """\nfrom tests.checkpoints.test_files import fresh_state\n"""\n',
    ],
    ids=["from-module", "inside-a-function", "import-module", "from-package", "in-a-script"],
)
def test_every_form_of_such_an_import_is_found(source):
    assert imports_of_test_modules(source)


def test_imports_of_helper_modules_are_not_such_imports():
    source = (
        "from tests.helpers.configs import small\nfrom tests import threads\n"
        "import tests.envs.user_envs as user_envs\nfrom tests.runtime import topologies\n"
    )
    assert imports_of_test_modules(source) == []
