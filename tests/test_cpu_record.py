"""The per-test CPU plugin (tests/cpu_record.py) counts a test's own CPU and its children's."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.helpers.cli import podrace_env

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3:\n    pass\n"

TESTS = textwrap.dedent(
    f"""
    import subprocess, sys, time

    def test_burns_its_own_cpu():
        t = time.process_time()
        while time.process_time() - t < 0.3:
            pass

    def test_waits_for_a_child_that_burns_cpu():
        subprocess.run([sys.executable, "-c", {BURN!r}], check=True)
    """
)


@pytest.mark.timeout(120)
def test_each_test_gets_a_line_with_its_own_and_its_childrens_cpu(tmp_path):
    (tmp_path / "test_burn.py").write_text(TESTS)
    log = tmp_path / "cpu.jsonl"
    env = podrace_env(PODRACE_TEST_CPU_LOG=str(log))
    env.pop("PYTEST_XDIST_WORKER", None)  # this suite's own, under -n N
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p"]
    done = subprocess.run(
        [*args, "tests.cpu_record", str(tmp_path)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    own, child = (json.loads(line) for line in log.read_text().splitlines())
    assert own["id"].endswith("test_burns_its_own_cpu") and own["self"] >= 0.3, own
    assert child["id"].endswith("test_waits_for_a_child_that_burns_cpu"), child
    assert child["children"] >= 0.3 and child["self"] < 0.3, child
    assert own["wall"] >= own["self"] and own["worker"] == "main"


@pytest.mark.timeout(120)
def test_without_a_log_file_named_it_is_a_usage_error(tmp_path):
    env = {k: v for k, v in podrace_env().items() if k != "PODRACE_TEST_CPU_LOG"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.cpu_record", str(tmp_path)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 4 and "PODRACE_TEST_CPU_LOG" in done.stderr, done
