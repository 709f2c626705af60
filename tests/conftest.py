"""Test configuration: force several CPU devices before JAX is imported anywhere."""

import atexit
import os
import shutil
import tempfile

import pytest

from tests.xla_flags import DEVICE_COUNT

# Four CPU devices, and three settings that make XLA:CPU compile the suite's many small
# programs faster, at the cost of slower code that no test measures: LLVM's optimization
# level 0, XLA's older loop emitters instead of its fusion emitters, and each program's
# code generated as one LLVM module instead of split for parallel compilation. Most tests
# spend their time compiling programs once; on 2 cores tests/algos/test_sharding.py and
# test_updates.py took 127 core-s with only -O0 and 61 with the loop emitters too; on a
# later day one module per program took them from 77 to 64 core-s, and the whole suite
# from 1712 to 1638. XLA:CPU uses no fast-math under any of them; the digests of
# tests/test_feedforward_unchanged.py are recorded under exactly these flags. Subprocesses
# inherit the flags; the multi-process and resume tests drop only the device count.
for _flag in (
    f"{DEVICE_COUNT}=4",
    "--xla_backend_optimization_level=0",
    "--xla_cpu_use_fusion_emitters=false",
    "--xla_cpu_parallel_codegen_split_count=1",
):
    if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# A Ray started in this process (tests/sync) would install its C++ crash handler over
# pytest's faulthandler, as the podrace command prevents too: an abort of the suite's
# process would then print nothing at all (exit 134, no stack).
os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
# `podrace train` turns JAX's persistent compilation cache on; the suite must neither write
# into the user's cache nor depend on what an earlier run left there. So it shares one
# cache of its own, empty at the start and deleted at the end: the many `podrace train`
# processes it starts with the same preset then load most of their programs instead of
# compiling them again. The process that creates the cache names it in
# PODRACE_SUITE_XLA_CACHE; xdist's workers and every subprocess inherit that and share it.
# A size bound makes JAX lock the directory around each read and write, so no process reads
# an entry that another is still writing. tests/runtime/test_xla_setup.py sets its own
# cache, in a temporary directory, for the tests of the cache.
_CACHE = os.environ.get("PODRACE_SUITE_XLA_CACHE")
if _CACHE is None:
    _CACHE = os.environ["PODRACE_SUITE_XLA_CACHE"] = tempfile.mkdtemp(prefix="podrace-suite-xla-")
    atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "true"
os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE
os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(8 << 30)

_config = None


@pytest.fixture
def fake_wandb(monkeypatch):
    """A fake `wandb` module for the test (tests/helpers/wandb.py)."""
    from tests.helpers.wandb import install_fake_wandb

    return install_fake_wandb(monkeypatch)


@pytest.fixture(autouse=True)
def _record_threads_at_start():
    from tests import threads

    threads.record()


def pytest_configure(config):
    global _config
    _config = config


def pytest_collection_modifyitems(config, items):
    from tests.scheduling import longest_first, longest_tests

    longest_first(items, longest_tests())


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Hand the longest tests out one at a time (tests/scheduling.py) under `-n N`."""
    if config.getvalue("dist") != "load":
        return None
    from tests.scheduling import LongestFirstScheduling, longest_tests

    return LongestFirstScheduling(config, log, longest_tests())


def pytest_sessionfinish(session, exitstatus):
    session.config._podrace_exitstatus = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Leave without interpreter finalization, as the `podrace` command does (supervisor.leave):
    threads that tests leave in native code on purpose (stuck envs, learners in a collective)
    are killed there, and a C++ `catch (...)` that swallows that forced unwind aborts the
    process ("FATAL: exception not rethrown", exit 134) after every test passed. atexit
    handlers still run (the cache above, Ray)."""
    status = getattr(config, "_podrace_exitstatus", None)
    if status is None:  # e.g. --collect-only errors: leave as pytest would
        return
    from podrace.commands.supervisor import leave

    leave(status)


_sigint_seen = [None]


def pytest_runtest_logfinish(nodeid, location):
    """Name the test after which the suite's own SIGINT handling changed (ignored, blocked,
    another handler): every subprocess a later test starts inherits an ignored or blocked
    SIGINT, and a test that sends one then waits for a stop that never comes."""
    import signal

    state = (
        signal.getsignal(signal.SIGINT),
        signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []),
    )
    if _sigint_seen[0] is not None and state != _sigint_seen[0]:
        os.write(2, f"\npodrace-suite: SIGINT handler, blocked after {nodeid}: {state}\n".encode())
    _sigint_seen[0] = state


def pytest_runtest_logreport(report):
    """Name a failure the moment it happens (CI keeps only the start of a long log)."""
    if not report.failed or _config is None:
        return
    reporter = _config.pluginmanager.get_plugin("terminalreporter")
    crash = getattr(report.longrepr, "reprcrash", None)
    why = crash.message.splitlines()[0][:200] if crash is not None and crash.message else ""
    if reporter is not None:
        reporter.write_line(f"\nFAILED {report.nodeid} ({report.when}): {why}")
