import os
import subprocess
import sys

import pytest

TRAIN = [sys.executable, "-m", "podrace.cli", "train", "cartpole-ppo", "--total-steps", "4096",
         "--eval.episodes", "2", "--log.console", "none"]


def _train(tmp_path, name: str, cache: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), JAX_ENABLE_COMPILATION_CACHE=cache)
    done = subprocess.run(TRAIN + ["--log.run-dir", str(tmp_path / "runs"), "--log.run-name", name],
                          env=env, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr


def _entries(tmp_path) -> set[str]:
    cache = tmp_path / "xdg" / "podrace" / "xla"
    return set(os.listdir(cache)) if cache.exists() else set()


@pytest.mark.timeout(360)
def test_train_keeps_every_program_in_the_cache_and_a_second_run_compiles_none(tmp_path):
    _train(tmp_path, "first", "true")
    first = _entries(tmp_path)
    assert len(first) >= 4, first  # network init, actor step, learner update, evaluation chunk
    _train(tmp_path, "second", "true")
    assert _entries(tmp_path) == first  # every program was loaded; none compiled anew


@pytest.mark.timeout(200)
def test_the_cache_turned_off_writes_nothing(tmp_path):
    _train(tmp_path, "off", "false")
    assert _entries(tmp_path) == set()
