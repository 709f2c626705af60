"""Modules gymnax imports only to render are imported when first used, not with gymnax."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from podrace.envs.deferred_imports import defer
from tests.helpers.cli import podrace_env

PROBE = """
imported.append(__name__)
value = 42
"""


@pytest.fixture
def probe(tmp_path, monkeypatch):
    """A package `deferred_probe` with a module `deferred_probe.plots` that records its
    import in `deferred_probe.imported`."""
    package = tmp_path / "deferred_probe"
    package.mkdir()
    (package / "__init__.py").write_text("imported = []\n")
    (package / "plots.py").write_text("from deferred_probe import imported\n" + PROBE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in [n for n in sys.modules if n.startswith("deferred_probe")]:
        del sys.modules[name]


def test_a_deferred_module_is_imported_when_an_attribute_is_first_read(probe):
    import deferred_probe

    defer(["deferred_probe.plots"])
    import deferred_probe.plots as plots  # as gymnax's modules import pyplot

    assert deferred_probe.imported == []
    assert plots.value == 42 and deferred_probe.imported == ["deferred_probe.plots"]
    assert plots.value == 42 and deferred_probe.imported == ["deferred_probe.plots"]
    from deferred_probe.plots import value  # later imports get the real module

    assert value == 42 and sys.modules["deferred_probe.plots"].value == 42
    assert deferred_probe.imported == ["deferred_probe.plots"]


def test_modules_imported_already_or_not_installed_are_left_alone(probe):
    import deferred_probe.plots

    defer(["deferred_probe.plots", "no_such_package_anywhere.plots"])
    assert sys.modules["deferred_probe.plots"] is deferred_probe.plots
    assert "no_such_package_anywhere.plots" not in sys.modules


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_gymnax_env_loads_without_its_rendering_packages():
    """seaborn (with scipy.stats and pandas) and pyplot wait for a render; one still works."""
    code = textwrap.dedent(
        """
        import sys
        from podrace.config import EnvConfig
        from podrace.envs.jax_envs import load_jax_env

        load_jax_env(EnvConfig(id="gymnax:CartPole-v1", backend="jax"))
        heavy = ["scipy.stats", "pandas", "matplotlib.figure"]
        print([name for name in heavy if name in sys.modules])
        import gymnax.environments.misc.pong as pong
        print(len(pong.sns.color_palette("cubehelix", 3)), callable(pong.plt.subplots))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=podrace_env()
    ).stdout
    assert out.split("\n")[:2] == ["[]", "3 True"], out
