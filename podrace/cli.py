"""`podrace` command line: `podrace train <preset> [--field value ...]`.

The config is parsed and validated before JAX is imported, so that the CLI can force as
many CPU devices as the layout names (appending to, never replacing, the user's XLA_FLAGS).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Sequence

from podrace.config import ConfigError, TrainConfig, validate

USAGE = """usage: podrace train <preset> [--flags]   (podrace train --help lists presets and flags)"""


def _error(message: str) -> int:
    print(f"podrace: error: {message}", file=sys.stderr)
    return 2


def force_cpu_devices(count: int) -> None:
    """Ask XLA:CPU for `count` devices; must run before JAX is imported."""
    flag = "--xla_force_host_platform_device_count"
    flags = os.environ.get("XLA_FLAGS", "")
    if count > 1 and flag not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {flag}={count}".strip()


def parse_train(args: Sequence[str]) -> TrainConfig:
    import tyro

    from podrace.presets import PRESETS

    return tyro.extras.overridable_config_cli(PRESETS, prog="podrace train", args=list(args))


def _raise_interrupt(signum, frame):  # noqa: ARG001 - signal handler signature
    raise KeyboardInterrupt


def train_command(args: Sequence[str]) -> int:
    cfg = parse_train(args)
    try:
        validate(cfg)
        from podrace.envs import resolve_backend
        from podrace.runtime.devices import required_cpu_devices
        from podrace.runtime.rundir import check_run_dir

        if cfg.layout.platform in (None, "cpu"):
            force_cpu_devices(required_cpu_devices(cfg))
        resolve_backend(cfg.env)
        check_run_dir(cfg)
        from podrace.runtime.single_host import Interrupted, train

        signal.signal(signal.SIGTERM, _raise_interrupt)
        result = train(cfg)
    except ConfigError as error:
        return _error(str(error))
    except Interrupted:
        print("podrace: interrupted, stopped cleanly", file=sys.stderr)
        return 130
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
