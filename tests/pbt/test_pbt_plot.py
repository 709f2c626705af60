"""`podrace plot` of a population's run directory: members' curves, exploits, schedules."""

import dataclasses
import json

from podrace.config import replace
from podrace.metrics.pbt_plot import plot_population, population_config
from podrace.presets import PRESETS
from tests.helpers.cli import run_cli


def _population(root, members=2):
    cfg = replace(
        PRESETS["cartpole-ppo"][1],
        **{"pbt.population": members, "pbt.mutate": ("learning_rate", "gamma")},
    )
    root.mkdir()
    (root / "config.json").write_text(json.dumps(dataclasses.asdict(cfg)))
    for m in range(members):
        member = root / f"member-{m}"
        member.mkdir()
        (member / "config.json").write_text(
            json.dumps(dataclasses.asdict(replace(cfg, **{"pbt.member": m})))
        )
        lines = [
            {"env_steps": 1000.0 * k, "version": k, "eval/return": 10.0 * k + m,
             "learner/hp/learning_rate": 1e-3 * (1 + m), "learner/hp/gamma": 0.99}
            for k in range(1, 6)
        ]  # fmt: skip
        (member / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (root / "pbt.jsonl").write_text(
        json.dumps({"member": 0, "member_step": 3000, "copied": 1, "version": 3}) + "\n"
    )
    return cfg


def test_a_population_is_drawn_with_a_panel_per_hyperparameter(tmp_path, capsys):
    root = tmp_path / "pop"
    _population(root)
    cfg = population_config(root)
    assert cfg is not None and population_config(root / "member-0") is None
    fig = plot_population(root, cfg)
    assert len(fig.axes) == 3  # the metric, learning_rate, gamma
    assert [line.get_label() for line in fig.axes[0].get_legend().get_lines()] == [
        "member-0", "member-1"
    ]  # fmt: skip
    assert "1 exploits" in fig._suptitle.get_text()
    code, out, err = run_cli(capsys, "plot", str(root), "-o", str(tmp_path / "p.png"))
    assert code == 0, err
    assert (tmp_path / "p.png").stat().st_size > 0


def test_a_population_with_other_runs_is_one_line_and_exit_2(tmp_path, capsys):
    root = tmp_path / "pop"
    _population(root)
    code, _, err = run_cli(
        capsys, "plot", str(root), str(root / "member-0"), "-o", str(tmp_path / "p.png")
    )
    assert code == 2 and "one population at a time" in err
    assert len(err.strip().splitlines()) == 1
