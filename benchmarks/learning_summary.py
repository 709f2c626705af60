"""A suite's summary.json: per (task, preset), every seed's final return, their mean and
std, read from the suite's result JSONs."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from learning_runs import write_json
from learning_suites import Suite

SUMMARY = "summary.json"
STD_RULE = "population std over seeds (ddof=0, as CleanRL's tables)"


def load_results(suite: Suite, results: Path) -> list[dict]:
    """The suite's result JSONs (summary.json left out), in file-name order."""
    folder = results / suite.name
    if not folder.is_dir():
        return []
    return [
        json.loads(path.read_text())
        for path in sorted(folder.glob("*.json"))
        if path.name != SUMMARY
    ]


def rows(suite: Suite, results: list[dict]) -> list[dict]:
    """One row per (task, preset) of the suite, in the suite's order; seeds sorted."""
    table = []
    for task in suite.tasks:
        for preset in suite.presets:
            found = sorted(
                (r for r in results if r["task"] == task and r["preset"] == preset),
                key=lambda r: r["seed"],
            )
            finals = [r["final_return"] for r in found if r["final_return"] is not None]
            trained = [r.get("final_train_return") for r in found]
            trained = [v for v in trained if v is not None]
            table.append(
                {
                    "task": task,
                    "preset": preset,
                    "seeds": [r["seed"] for r in found],
                    "final_returns": [r["final_return"] for r in found],
                    "mean": statistics.fmean(finals) if finals else None,
                    "std": statistics.pstdev(finals) if finals else None,
                    "final_train_returns": [r.get("final_train_return") for r in found],
                    "train_mean": statistics.fmean(trained) if trained else None,
                    "wall_s": [r["wall_s"] for r in found],
                    "steps_per_s": [r["steps_per_s"] for r in found],
                }
            )
    return table


def summary(suite: Suite, results: Path) -> dict:
    found = load_results(suite, results)
    return {
        "suite": suite.name,
        "title": suite.title,
        "total_steps": suite.total_steps,
        "budget": suite.budget,
        "final_return_rule": found[0]["final_return_rule"] if found else None,
        "final_train_return_rule": found[0].get("final_train_return_rule") if found else None,
        "std_rule": STD_RULE,
        "rows": rows(suite, found),
    }


def write_summary(suite: Suite, results: Path) -> None:
    write_json(results / suite.name / SUMMARY, summary(suite, results))
