"""`python -m podrace.sync.shm_sweep [--dry-run]`: remove /dev/shm segments of dead publishers.

The rule (both signs of a dead writer) is in `shm_leaks`; this is its command line.
"""

from __future__ import annotations

import argparse
import os

from podrace.sync.shm_leaks import SHM_DIR, sweep_shm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m podrace.sync.shm_sweep",
        description="Remove /dev/shm segments left by podrace shm publishers that died.",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="list what would be removed, remove nothing"
    )
    args = parser.parse_args(argv)
    swept = sweep_shm(dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for seg in swept:
        print(f"{verb} {os.path.join(SHM_DIR, seg)}")
    if not swept:
        print("no leaked podrace segments")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
