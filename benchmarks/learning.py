"""Learning benchmark: run a suite's grid (task x preset x seed) with `podrace train`, one run
at a time, and write one result JSON per run and a summary per suite.

    python benchmarks/learning.py --suite minatar --seeds 3 [--tasks T ...] [--presets P ...]
        [--dry-run] [-- extra podrace train flags]
    python benchmarks/learning.py --report [--check]

Suites (benchmarks/learning_suites.py): minatar (5 MinAtar games x minatar-ppo,
minatar-impala, 5M steps), minatar20m (minatar-ppo, 20M steps), mujoco (HalfCheetah-v4,
Hopper-v4 x mujoco-ppo, 1M steps), atari (Pong-v5, Breakout-v5 x atari-ppo, 10M frames; a
GPU machine) and smoke (CartPole, for checking the runner).

Resumable: a run whose JSON exists is skipped; a stopped run continues from its latest
checkpoint (`podrace train --resume`; the runner makes every run checkpoint every 5% of
its updates). SIGINT or SIGTERM stops the current run cleanly (it saves a checkpoint) and
ends the runner; running the same command again picks up where it stopped. Run directories
go under runs/learning/<suite>/ (not in git), results under
benchmarks/results/learning/<suite>/, each `podrace train`'s output in
runs/learning/<suite>/<run>.log.

--report writes docs/results.md and its figures from the committed results; --check only
compares docs/results.md with what the results give (exit 1 when it differs).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import learning_runs as runs_mod
from learning_suites import REPO, RESULTS, RUNS, SUITES, GridError, RunSpec, grid
from learning_summary import write_summary

from podrace.config import ConfigError


class Stop:
    """The first SIGINT/SIGTERM: remembered, and passed on once to the current run as SIGINT
    (podrace's clean stop: it saves a checkpoint). The run is in its own session, so a
    Ctrl-C at the terminal reaches it only through here, once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.child: subprocess.Popen | None = None
        self.forwarded = False

    def install(self) -> None:
        signal.signal(signal.SIGINT, self.handle)
        signal.signal(signal.SIGTERM, self.handle)

    def handle(self, signum: int, _frame) -> None:
        if self.signum is None:
            self.signum = signum
            print(f"learning: {signal.Signals(signum).name} received, stopping the run", flush=True)
        self.forward()

    def forward(self) -> None:
        if self.child is not None and not self.forwarded and self.child.poll() is None:
            self.forwarded = True
            self.child.send_signal(signal.SIGINT)


SET_BY_THE_SUITE = ("--env.id", "--seed", "--total-steps", "--log.run-dir", "--log.run-name")
"""`podrace train` flags the runner sets for every run; extra flags may not change them."""


def check_extra(extra: list[str]) -> None:
    for arg in extra:
        if arg.partition("=")[0] in SET_BY_THE_SUITE:
            raise ConfigError(f"{arg.partition('=')[0]} is set by the suite for every run")


def schedule_for(spec: RunSpec, extra: list[str]) -> runs_mod.Schedule:
    """Eval and checkpoint intervals from the preset's updates at the suite's budget; a
    ConfigError (one line) for a preset or flag `podrace train` does not take."""
    from podrace.commands.train import parse_train
    from podrace.presets import PRESETS

    if spec.preset not in PRESETS:
        raise ConfigError(
            f"preset {spec.preset!r} is not in this checkout of podrace "
            f"(presets: {', '.join(sorted(PRESETS))})"
        )
    cfg = parse_train(
        [spec.preset, "--env.id", spec.task, "--total-steps", str(spec.suite.total_steps), *extra]
    )
    return runs_mod.Schedule.for_updates(cfg.num_updates)


def launch(args: list[str], spec: RunSpec, runs: Path, stop: Stop) -> tuple[int, float]:
    """Run `podrace <args>` to its end (output appended to the run's log): (exit code, s)."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    log = spec.log_path(runs)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.write(f"\n$ podrace {' '.join(args)}\n".encode())
        out.flush()
        start = time.monotonic()
        child = subprocess.Popen(
            [sys.executable, "-m", "podrace.cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=env,
            start_new_session=True,
        )
        stop.child, stop.forwarded = child, False
        if stop.signum is not None:  # a signal that came while the run was starting
            stop.forward()
        code = child.wait()
        stop.child = None
    return code, time.monotonic() - start


def run_one(
    spec: RunSpec,
    runs: Path,
    results: Path,
    extra: list[str],
    runner_command: list[str],
    stop: Stop,
    schedule: runs_mod.Schedule,
) -> str:
    """Take one run as far as it goes: done, stopped or failed."""
    where = runs_mod.state(spec, runs, results)
    if where == "done":
        return "done (skipped)"
    if where in ("new", "abandoned", "stopped"):
        if where == "abandoned":
            moved = runs_mod.set_aside(spec, runs)
            print(f"  {spec.run_dir(runs)} had no checkpoint: moved to {moved.name}", flush=True)
        stopped = where == "stopped"
        fresh = runs_mod.train_args(spec, runs, schedule, extra)
        args = runs_mod.resume_args(spec, runs) if stopped else fresh
        from_update = runs_mod.checkpoint_steps(spec.run_dir(runs))[-1] if stopped else 0
        print(f"  {'resume from update ' + str(from_update) if stopped else 'start'}", flush=True)
        started_at = datetime.now(UTC).isoformat(timespec="seconds")
        code, wall_s = launch(args, spec, runs, stop)
        runs_mod.add_segment(
            spec,
            runs,
            {
                "started_at": started_at,
                "wall_s": round(wall_s, 1),
                "from_update": from_update,
                "exit_code": code,
                "command": runs_mod.command_line(args),
            },
        )
        if code != 0 or not runs_mod.reached_the_end(spec.run_dir(runs)):
            outcome = "stopped" if stop.signum is not None else "failed"
            return f"{outcome} (exit {code}; see {runs_mod.relative(spec.log_path(runs))})"
    data = runs_mod.result(spec, runs, runner_command)
    runs_mod.write_json(spec.result_path(results), data)
    write_summary(spec.suite, results)
    final = data["final_return"]
    shown = "no evaluation" if final is None else f"final return {final:.2f}"
    return f"done: {shown}, {data['wall_s']:.0f} s"


def run_grid(options: argparse.Namespace, extra: list[str]) -> int:
    suite = SUITES[options.suite]
    specs = grid(suite, options.seeds, tuple(options.tasks), tuple(options.presets))
    runs, results = Path(options.runs), Path(options.results)
    if options.dry_run:
        for spec in specs:
            where = runs_mod.state(spec, runs, results)
            print(f"{spec.name}: {where}  ({runs_mod.relative(spec.result_path(results))})")
        return 0
    check_extra(extra)
    schedules: dict[tuple[str, str], runs_mod.Schedule] = {}
    for spec in specs:  # every preset and flag checked before the first run starts
        if (spec.preset, spec.task) not in schedules:
            schedules[spec.preset, spec.task] = schedule_for(spec, extra)
    runner_command = ["python", "benchmarks/learning.py", *sys.argv[1:]]
    stop = Stop()
    stop.install()
    failed = 0
    for i, spec in enumerate(specs, 1):
        if stop.signum is not None:
            break
        print(f"[{i}/{len(specs)}] {spec.task} {spec.preset} seed {spec.seed}", flush=True)
        schedule = schedules[spec.preset, spec.task]
        outcome = run_one(spec, runs, results, extra, runner_command, stop, schedule)
        failed += outcome.startswith("failed")
        print(f"  {outcome}", flush=True)
    if stop.signum is not None:
        return 128 + stop.signum
    return 1 if failed else 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="benchmarks/learning.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--suite", choices=sorted(SUITES))
    p.add_argument("--seeds", type=int, default=3, help="seeds 1..N (default 3)")
    p.add_argument("--tasks", nargs="+", default=[], help="only these tasks of the suite")
    p.add_argument("--presets", nargs="+", default=[], help="only these presets of the suite")
    p.add_argument("--dry-run", action="store_true", help="list the grid and each run's state")
    p.add_argument("--runs", default=str(RUNS), help="parent of the suites' run directories")
    p.add_argument("--results", default=str(RESULTS), help="parent of the suites' result JSONs")
    p.add_argument("--report", action="store_true", help="write docs/results.md and figures")
    p.add_argument("--check", action="store_true", help="with --report: only compare")
    p.add_argument("--docs", default=str(REPO / "docs"), help="with --report: the docs folder")
    return p


def main(argv: list[str]) -> int:
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1 :]
    p = parser()
    options = p.parse_args(argv)
    try:
        if options.report:
            from learning_report import report

            return report(Path(options.results), options.check, Path(options.docs))
        if options.suite is None:
            p.error("give --suite (or --report)")
        if options.seeds < 1:
            p.error("--seeds must be at least 1")
        return run_grid(options, extra)
    except (ConfigError, GridError) as error:
        print(f"learning: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
