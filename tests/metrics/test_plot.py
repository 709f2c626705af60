"""`podrace plot`: learning curves and the time breakdown read from a run's files."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from podrace.cli import main
from podrace.commands.plot import check_output, save_figure
from podrace.config import ConfigError
from podrace.metrics.plot import DPI, FIGSIZE, load_run, plot_runs, time_breakdown
from tests.helpers.cli import run_podrace
from tests.metrics.synthetic_runs import synthetic_run


@pytest.mark.timeout(60)
def test_time_breakdown_is_mean_times_updates_per_interval(tmp_path):
    synthetic_run(tmp_path / "run")
    breakdown = time_breakdown(load_run(tmp_path / "run"))
    assert breakdown["learner"] == pytest.approx(
        {"learner step": 3.0, "queue get wait": 0.6, "publish": 0.03}
    )
    assert breakdown["actor"] == pytest.approx(
        {
            "env step": 0.3,
            "inference": 0.6,
            "device→host": 0.03,
            "other (rollout)": 0.27,
            "to learner devices": 0.12,
            "queue put wait": 0.09,  # after the rollout, not part of it
        }
    )


@pytest.mark.timeout(60)
def test_a_compiled_rollout_is_one_part_not_other_work(tmp_path):
    """A compiled rollout (envpool on CPU) reports no env-step, inference or device-to-host
    timers: its whole rollout is drawn as one part, not as "other (rollout)"."""
    synthetic_run(tmp_path / "run")
    path = tmp_path / "run" / "metrics.jsonl"
    drop = ("actor/env_step", "actor/inference", "actor/device_to_host")
    lines = [
        {k: v for k, v in json.loads(line).items() if k not in drop}
        for line in path.read_text().splitlines()
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    breakdown = time_breakdown(load_run(tmp_path / "run"))
    assert breakdown["actor"] == pytest.approx(
        {"compiled env + policy steps": 1.2, "to learner devices": 0.12, "queue put wait": 0.09}
    )


@pytest.mark.timeout(60)
def test_figure_has_curves_per_run_labelled_axes_and_a_time_bar_per_thread(tmp_path):
    cfg = synthetic_run(tmp_path / "first")
    synthetic_run(tmp_path / "second", scale=2.0)
    fig = plot_runs([tmp_path / "first", tmp_path / "second"])
    fig.canvas.draw()
    by_steps, by_time, bars = fig.axes

    assert fig._suptitle.get_text() == "CartPole-v1 · PPO"
    assert (by_steps.get_title(), by_steps.get_xlabel(), by_steps.get_ylabel()) == (
        "Return vs env steps",
        "env steps",
        "episode return",
    )
    assert (by_time.get_title(), by_time.get_xlabel()) == (
        "Return vs wall-clock time",
        "wall-clock time (s)",
    )
    assert (bars.get_title(), bars.get_ylabel()) == (
        "Where the time went",
        "seconds (per thread, whole run)",
    )

    legend = [t.get_text() for t in by_steps.get_legend().get_texts()]
    assert legend == ["first", "second", "training episodes", "evaluation (greedy)"]
    train_line, eval_line = by_steps.get_lines()[:2]
    assert list(train_line.get_xdata()) == [v * cfg.steps_per_update for v in (10, 20, 30)]
    assert list(train_line.get_ydata()) == [100.0, 200.0, 300.0]
    assert list(eval_line.get_xdata()) == [
        10 * cfg.steps_per_update,
        30 * cfg.steps_per_update,
    ]  # once each
    assert list(eval_line.get_ydata()) == [50.0, 400.0]
    assert list(by_time.get_lines()[0].get_xdata()) == [1.5, 3.0, 4.5]

    assert any("," in t.get_text() for t in by_steps.get_xticklabels())  # e.g. 10,000
    assert [t.get_text() for t in bars.get_xticklabels()] == [
        "first\none actor thread",
        "first\nlearner thread",
        "second\none actor thread",
        "second\nlearner thread",
    ]
    assert len(bars.patches) == 2 * (6 + 3)  # per run: 6 actor parts, 3 learner parts


def test_a_run_of_one_metrics_line_shows_its_training_return_as_a_point(tmp_path):
    """A run shorter than --log.interval-s has one line: a line plot of one point draws nothing."""
    synthetic_run(tmp_path / "short")
    metrics = tmp_path / "short" / "metrics.jsonl"
    metrics.write_text(metrics.read_text().splitlines()[-1] + "\n")
    synthetic_run(tmp_path / "long")
    by_steps = plot_runs([tmp_path / "short", tmp_path / "long"]).axes[0]
    short, _, long, _ = by_steps.get_lines()[:4]
    assert list(short.get_ydata()) == [300.0] and short.get_marker() == "o"
    assert long.get_marker() in ("None", None, "")


@pytest.mark.timeout(60)
def test_runs_of_different_envs_name_env_and_algo(tmp_path):
    synthetic_run(tmp_path / "a")
    synthetic_run(tmp_path / "b", env_id="Pendulum-v1")
    fig = plot_runs([tmp_path / "a", tmp_path / "b"])
    assert fig._suptitle.get_text() == "CartPole-v1 · PPO; Pendulum-v1 · PPO"
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend[:2] == ["a (CartPole-v1, ppo)", "b (Pendulum-v1, ppo)"]


@pytest.mark.timeout(60)
def test_png_is_a_valid_image_of_the_figure_size(tmp_path):
    synthetic_run(tmp_path / "run")
    out = tmp_path / "out.png"
    save_figure(plot_runs([tmp_path / "run"]), out)
    image = Image.open(out)
    assert image.format == "PNG"
    assert image.size == (round(FIGSIZE[0] * DPI), round(FIGSIZE[1] * DPI))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left


@pytest.mark.timeout(60)
def test_a_killed_runs_truncated_last_line_is_skipped_but_damage_elsewhere_is_an_error(tmp_path):
    synthetic_run(tmp_path / "run")
    metrics = tmp_path / "run" / "metrics.jsonl"
    with open(metrics, "a") as f:
        f.write('{"version": 40, "env_st')
    assert len(load_run(tmp_path / "run").lines) == 3
    metrics.write_text('{"broken\n' + metrics.read_text())
    with pytest.raises(ConfigError, match=r"metrics.jsonl:1 is not valid JSON"):
        load_run(tmp_path / "run")
    with pytest.raises(ConfigError, match="is .* a podrace run directory"):
        load_run(tmp_path / "missing")


@pytest.mark.timeout(120)
def test_cli_plot_writes_the_image_and_exits_2_on_errors(tmp_path):
    synthetic_run(tmp_path / "a")
    synthetic_run(tmp_path / "b", scale=2.0)
    command = ("plot", str(tmp_path / "a"), str(tmp_path / "b"))
    ok = run_podrace(*command, "-o", str(tmp_path / "out.png"), timeout=100)
    assert ok.returncode == 0, ok.stderr
    assert Image.open(tmp_path / "out.png").format == "PNG"
    with open("/dev/full", "w") as full:  # the image is written; its line cannot be
        refused = run_podrace(
            *command,
            "-o",
            str(tmp_path / "again.png"),
            stdout=full,
            stderr=subprocess.PIPE,
            timeout=100,
        )
    assert refused.returncode == 1 and refused.stderr.splitlines() == [
        "podrace: error: could not write to stdout (No space left on device); "
        "the command itself succeeded"
    ]
    assert Image.open(tmp_path / "again.png").format == "PNG"

    bad = run_podrace(*command, "-o", str(tmp_path / "out.xyz"), timeout=100)
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1 and bad.stderr.startswith(
        "podrace: error: cannot write"
    )
    assert not (tmp_path / "out.xyz").exists()


@pytest.mark.timeout(30)
def test_no_run_directory_is_a_config_error():
    with pytest.raises(ConfigError, match="at least one run directory"):
        plot_runs([])


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "bad,problem",
    [
        (b"3", "is not a JSON object of metrics (got int)"),
        (b"[1, 2]", "is not a JSON object of metrics (got list)"),
        (b'"text"', "is not a JSON object of metrics (got str)"),
        (
            b'{"version": 5, "time_s": \xff\xfe}',
            "is not valid UTF-8: invalid start byte at byte 25",
        ),
        (
            b"[" * 100_000 + b"]" * 100_000,
            "is not valid JSON: nested too deeply to decode: line 1 column 1 (char 0)",
        ),
        (
            b'{"version": ' + b"7" * 5000 + b"}",
            "is not valid JSON: Exceeds the limit (4300 digits) for integer string "
            "conversion: value has 5000 digits: line 1 column 1 (char 0)",
        ),
    ],
)
def test_a_metrics_line_that_is_not_an_object_is_an_error_naming_file_and_line(
    tmp_path, capsys, bad, problem
):
    synthetic_run(tmp_path / "run")
    metrics = tmp_path / "run" / "metrics.jsonl"
    lines = metrics.read_bytes().splitlines()
    metrics.write_bytes(b"\n".join(lines[:2] + [bad] + lines[2:]) + b"\n")
    with pytest.raises(ConfigError) as error:
        load_run(tmp_path / "run")
    assert str(error.value) == f"{metrics}:3 {problem}"

    code = main(["plot", str(tmp_path / "run"), "-o", str(tmp_path / "out.png")])
    err = capsys.readouterr().err
    assert code == 2 and err == f"podrace: error: {metrics}:3 {problem}\n"
    assert not (tmp_path / "out.png").exists()

    metrics.write_bytes(b"\n".join(lines + [bad]))  # as the cut last line of a killed run: skipped
    assert len(load_run(tmp_path / "run").lines) == 3


@pytest.mark.timeout(60)
def test_a_config_json_that_is_not_utf8_is_an_error(tmp_path):
    synthetic_run(tmp_path / "run")
    (tmp_path / "run" / "config.json").write_bytes(b'{"algo": "\xe9"}')
    with pytest.raises(ConfigError, match=r"config.json is not valid UTF-8"):
        load_run(tmp_path / "run")


@pytest.mark.timeout(60)
def test_a_config_json_nested_too_deeply_is_an_error(tmp_path):
    synthetic_run(tmp_path / "run")
    (tmp_path / "run" / "config.json").write_text('{"algo": ' * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(
        ConfigError, match=r"config.json is not valid JSON: nested too deeply to decode"
    ):
        load_run(tmp_path / "run")


@pytest.mark.timeout(60)
def test_an_output_that_cannot_be_written_is_refused_before_plotting(tmp_path, capsys):
    synthetic_run(tmp_path / "run")
    directory = tmp_path / "dir.png"
    directory.mkdir()
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    cases = [
        (directory, f"cannot write {directory}: it is a directory"),
        (a_file / "p.png", f"cannot write {a_file / 'p.png'}: {a_file} is not a directory"),
        (tmp_path / ("p" * 300 + ".png"), "File name too long"),
    ]
    if os.geteuid() != 0:  # root writes into a mode 0o500 directory anyway
        locked = tmp_path / "locked"
        locked.mkdir(0o500)
        cases.append((locked / "p.png", f"cannot write {locked / 'p.png'}: Permission denied"))
    else:  # nobody, root included, can create a file in /proc
        cases.append((Path("/proc/p.png"), "cannot write /proc/p.png: "))
    for path, message in cases:
        with pytest.raises(ConfigError) as error:
            check_output(path)
        assert message in str(error.value)
        code = main(["plot", str(tmp_path / "run"), "-o", str(path)])
        err = capsys.readouterr().err
        assert (
            code == 2 and err.startswith("podrace: error: cannot write ") and err.count("\n") == 1
        ), err
        assert message in err or "File name too long" in message
    assert directory.is_dir() and list(directory.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["run", "dir.png", "a-file"] + (["locked"] if os.geteuid() != 0 else [])
    )


def _edit_lines(run_dir: Path, changes: list[dict]) -> None:
    """Apply `changes[i]` to metric line i (json.dumps writes inf, nan and huge ints as given)."""
    path = run_dir / "metrics.jsonl"
    lines = [json.loads(text) for text in path.read_text().splitlines()]
    for line, change in zip(lines, changes):
        line.update(change)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


@pytest.mark.timeout(120)
def test_values_too_extreme_to_draw_are_left_out_with_one_warning_and_the_rest_is_plotted(
    tmp_path,
):
    """env_steps 1e308 beside -1e308 ended in matplotlib's "ValueError: arange: cannot compute
    length" (a traceback, exit 1), an integer beyond float64 in an OverflowError, and near
    the float64 limit numpy's overflow warnings came ahead of the result."""
    cfg = synthetic_run(tmp_path / "run")
    _edit_lines(
        tmp_path / "run",
        [
            {"eval/return": float("inf")},  # not finite: left out too, as before
            {"env_steps": 1e308, "time_s": -1.7e308},
            {"episode/return": -1.7e308, "learner/step": 1e308, "eval/version": 10**400},
        ],
    )
    by_steps, by_time, bars = plot_runs([tmp_path / "run"]).axes
    train, evaluation = by_steps.get_lines()[:2]
    assert list(train.get_xdata()) == [10 * cfg.steps_per_update]  # only line 0 has all three
    assert list(by_time.get_lines()[0].get_xdata()) == [1.5]
    assert list(evaluation.get_xdata()) == []
    assert bars.patches[-3].get_height() == pytest.approx(0.1 * 20)  # learner step: lines 0, 1

    output = tmp_path / "out.png"
    proc = run_podrace("plot", str(tmp_path / "run"), "-o", str(output), timeout=100)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        f"podrace: warning: {tmp_path / 'run'}: 5 metric values of magnitude beyond 1e+100 "
        "are left out of the figure"
    ]
    assert proc.stdout == f"wrote {output}\n" and Image.open(output).format == "PNG"
