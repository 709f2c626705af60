import os
import subprocess
import sys

import pytest

from tests.helpers.cli import run_flags, run_podrace

TRAIN = (
    "train",
    "cartpole-ppo",
    "--total-steps",
    "4096",
    "--eval.episodes",
    "2",
    "--log.console",
    "none",
)


def _train(tmp_path, name: str, cache: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), JAX_ENABLE_COMPILATION_CACHE=cache)
    done = run_podrace(
        *TRAIN,
        *run_flags(tmp_path / "runs", name=name),
        env=env,
        timeout=150,
    )
    assert done.returncode == 0, done.stderr


def _entries(tmp_path) -> set[str]:
    cache = tmp_path / "xdg" / "podrace" / "xla"
    return set(os.listdir(cache)) if cache.exists() else set()


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_train_keeps_every_program_in_the_cache_and_a_second_run_compiles_none(tmp_path):
    _train(tmp_path, "first", "true")
    first = _entries(tmp_path)
    assert len(first) >= 4, first  # network init, actor step, learner update, evaluation chunk
    _train(tmp_path, "second", "true")
    assert _entries(tmp_path) == first  # every program was loaded; none compiled anew


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_the_cache_turned_off_writes_nothing(tmp_path):
    _train(tmp_path, "off", "false")
    assert _entries(tmp_path) == set()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_deterministic_run_from_python_gets_deterministic_gpu_kernels_before_jax_starts():
    """The deterministic-ops flag is set for a library caller too, not only by the CLI, so a
    deterministic run on a GPU never uses XLA's non-deterministic scatter-adds."""
    script = (
        "import os; from podrace.runtime.xla_setup import deterministic_gpu_ops; "
        "deterministic_gpu_ops(); print(os.environ['XLA_FLAGS'])"
    )
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=50
    )
    assert done.stdout.split() == ["--xla_gpu_deterministic_ops=true"], done.stderr


@pytest.mark.timeout(60)
def test_a_deterministic_run_on_a_gpu_started_without_the_flag_is_a_config_error(monkeypatch):
    import jax

    from podrace.config import ConfigError
    from podrace.runtime import xla_setup

    jax.devices()  # the backend has started
    monkeypatch.setattr(xla_setup, "_gpu_started", lambda: True)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    with pytest.raises(
        ConfigError,
        match=r"^deterministic needs XLA_FLAGS=--xla_gpu_deterministic_ops=true before JAX "
        r"starts its GPU backend, and this process started it without",
    ):
        xla_setup.deterministic_gpu_ops()
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_deterministic_ops=true")
    xla_setup.deterministic_gpu_ops()
    monkeypatch.setattr(xla_setup, "_gpu_started", lambda: False)  # XLA:CPU is deterministic anyway
    monkeypatch.setenv("XLA_FLAGS", "")
    xla_setup.deterministic_gpu_ops()


@pytest.mark.timeout(60)
def test_a_deterministic_run_from_python_asks_for_the_kernels_before_its_devices(
    tmp_path, monkeypatch
):
    from podrace.runtime import devices as device_module
    from podrace.runtime import run as runs
    from tests.helpers.configs import small

    class Enough(Exception):
        pass

    def devices(cfg):
        asked.append("devices")
        raise Enough

    asked = []
    monkeypatch.setattr(runs, "deterministic_gpu_ops", lambda: asked.append("ops"))
    monkeypatch.setattr(device_module, "resolve_devices", devices)
    with pytest.raises(Enough):
        runs.prepare(small(tmp_path, deterministic=True))
    assert asked == ["ops", "devices"]
