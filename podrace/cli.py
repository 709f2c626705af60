"""`podrace` command line: `podrace train <preset> [--field value ...]`.

The config is parsed and validated before JAX is imported, so that the CLI can force as
many CPU devices as the layout names (appending to, never replacing, the user's XLA_FLAGS).
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
import warnings
from typing import Sequence

from podrace.config import ConfigError, TrainConfig, validate
from podrace.control import ComponentError

USAGE = """usage: podrace train <preset> [--flags]   (podrace train --help lists presets and flags)"""


def _error(message: str) -> int:
    print(f"podrace: error: {message}", file=sys.stderr)
    return 2


def append_xla_flag(flag: str, value: str) -> None:
    """Add `flag=value` to XLA_FLAGS unless the user already set that flag."""
    flags = os.environ.get("XLA_FLAGS", "")
    if flag not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {flag}={value}".strip()


def force_cpu_devices(count: int) -> None:
    """Ask XLA:CPU for `count` devices; must run before JAX is imported."""
    if count > 1:
        append_xla_flag("--xla_force_host_platform_device_count", str(count))


def parse_train(args: Sequence[str]) -> TrainConfig:
    import tyro

    from podrace.presets import PRESETS

    return tyro.extras.overridable_config_cli(PRESETS, prog="podrace train", args=list(args))


class _Signals:
    """SIGINT and SIGTERM both stop the run cleanly; the exit code is 128 + the signal."""

    def __init__(self) -> None:
        self.received = signal.SIGINT

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._handle)

    def _handle(self, signum, frame) -> None:  # noqa: ARG002 - signal handler signature
        self.received = signum
        raise KeyboardInterrupt


def train_command(args: Sequence[str]) -> int:
    # envpool builds Gymnasium Box spaces from float64 bounds; the warning is noise to users.
    warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")
    cfg = parse_train(args)
    signals = _Signals()
    signals.install()
    try:
        validate(cfg)
        from podrace.envs import resolve_backend
        from podrace.runtime.rundir import check_run_dir

        if cfg.layout.platform in (None, "cpu"):
            force_cpu_devices(cfg.layout.cpu_devices)
        if cfg.deterministic:
            append_xla_flag("--xla_gpu_deterministic_ops", "true")
        resolve_backend(cfg.env)
        check_run_dir(cfg)
        if cfg.runtime == "ray":
            from podrace.runtime.ray_cluster import check_auth_not_disabled, import_ray

            # Ray's C++ crash handler also catches SIGTERM and re-raises it after ours, which
            # made one SIGTERM look like two; stack traces of real crashes stay in Ray's logs.
            os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
            import_ray()  # a missing Ray is a one-line error before JAX starts
            check_auth_not_disabled()
            from podrace.runtime.ray_run import train
        else:
            from podrace.runtime.single_host import train

        result = train(cfg)
    except ConfigError as error:
        return _error(str(error))
    except ComponentError as error:
        traceback.print_exception(error.error, file=sys.stderr)
        print(f"podrace: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        name = signal.Signals(signals.received).name
        print(f"podrace: {name} received, stopped cleanly", file=sys.stderr)
        return 128 + signals.received
    final = result.final_eval
    evaluation = f"final eval return {final.mean_return:.1f}" if final else "no final evaluation"
    print(
        f"done: {result.env_steps:,} env steps, {result.updates} updates in {result.train_s:.1f}s "
        f"(+{result.compile_s:.1f}s compile), {evaluation}\nrun directory: {result.run_dir}"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "train":
        return train_command(rest)
    return _error(f"unknown command '{command}'\n{USAGE}")


if __name__ == "__main__":
    sys.exit(main())
