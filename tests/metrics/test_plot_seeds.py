"""`podrace plot`: seeds of one configuration as their mean and range, published figures as
reference lines, and x tick labels that never overlap."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from PIL import Image

from podrace.config import ConfigError
from podrace.metrics.plot import plot_runs
from podrace.metrics.seed_curves import Reference, mean_and_spread, parse_reference
from podrace.metrics.ticks import SpacedLocator, label_overlaps
from tests.helpers.cli import run_podrace
from tests.metrics.synthetic_runs import synthetic_run


def test_mean_and_range_are_taken_where_every_seed_has_a_value():
    band = mean_and_spread([([0, 10, 20], [0.0, 10.0, 20.0]), ([5, 15, 25], [0.0, 20.0, 40.0])])
    assert list(band.x) == [5, 10, 15, 20]  # the union of steps, inside the common span
    first = np.array([5.0, 10.0, 15.0, 20.0])
    second = np.array([0.0, 10.0, 20.0, 30.0])
    assert band.mean == pytest.approx((first + second) / 2)
    assert band.low == pytest.approx(np.minimum(first, second))
    assert band.high == pytest.approx(np.maximum(first, second))
    assert band.seeds == 2
    assert mean_and_spread([([0, 1], [1.0, 2.0]), ([5, 6], [1.0, 2.0])]) is None
    assert mean_and_spread([([], []), ([5, 6], [1.0, 2.0])]) is None


@pytest.mark.timeout(60)
def test_seeds_of_one_configuration_are_one_mean_curve_with_its_range_shaded(tmp_path):
    cfg = synthetic_run(tmp_path / "s1", seed=1, scale=1.0)
    synthetic_run(tmp_path / "s2", seed=2, scale=2.0)
    synthetic_run(tmp_path / "s3", seed=3, scale=3.0)
    synthetic_run(tmp_path / "other", env_id="Pendulum-v1")
    fig = plot_runs([tmp_path / n for n in ("s1", "s2", "s3", "other")])
    by_steps = fig.axes[0]

    legend = [t.get_text() for t in by_steps.get_legend().get_texts()]
    assert legend[:2] == [
        "custom (CartPole-v1, ppo): mean of seeds 1, 2, 3, range shaded",
        "other (Pendulum-v1, ppo)",
    ]
    train, evaluation = by_steps.get_lines()[:2]
    assert list(train.get_xdata()) == [v * cfg.steps_per_update for v in (10, 20, 30)]
    assert list(train.get_ydata()) == pytest.approx([200.0, 400.0, 600.0])  # scales 1, 2, 3
    assert list(evaluation.get_ydata()) == pytest.approx([100.0, 800.0])
    shaded = [c for c in by_steps.collections if isinstance(c, PolyCollection)]
    assert len(shaded) == 2  # training and evaluation ranges of the one group
    low, high = shaded[0].get_paths()[0].vertices[:, 1].min(), 300.0 * 3
    assert (low, shaded[0].get_paths()[0].vertices[:, 1].max()) == pytest.approx((100.0, high))


@pytest.mark.timeout(60)
def test_the_same_seed_twice_is_two_runs_not_a_spread(tmp_path):
    synthetic_run(tmp_path / "a")
    synthetic_run(tmp_path / "b", scale=2.0)
    by_steps = plot_runs([tmp_path / "a", tmp_path / "b"]).axes[0]
    assert [t.get_text() for t in by_steps.get_legend().get_texts()][:2] == ["a", "b"]
    assert not [c for c in by_steps.collections if isinstance(c, PolyCollection)]


@pytest.mark.timeout(60)
def test_references_are_horizontal_lines_named_in_the_legend(tmp_path):
    synthetic_run(tmp_path / "run")
    references = [Reference(17.5, "Young & Tian AC(lambda) at 5M"), Reference(185.0, "AC")]
    by_steps, by_time, _ = plot_runs([tmp_path / "run"], references).axes
    for ax in (by_steps, by_time):
        lines = {line.get_label(): line for line in ax.get_lines()}
        line = lines["Young & Tian AC(lambda) at 5M (17.5)"]
        assert list(line.get_ydata()) == [17.5, 17.5]
        assert list(lines["AC (185)"].get_ydata()) == [185.0, 185.0]
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "Young & Tian AC(lambda) at 5M (17.5)" in legend


@pytest.mark.parametrize(
    "text", ["17.5", "x:label", "17.5:", ":label", "inf:label", "nan:label", "1e999:big"]
)
def test_a_reference_that_is_not_value_colon_label_is_a_config_error(text):
    with pytest.raises(ConfigError, match="--reference takes VALUE:LABEL"):
        parse_reference(text)


def test_a_reference_keeps_colons_in_its_label():
    assert parse_reference(' -2.5e1 : "At 5M: AC"') == Reference(-25.0, '"At 5M: AC"')


@pytest.mark.timeout(120)
def test_cli_reference_draws_and_a_bad_one_is_one_line_exit_2(tmp_path):
    synthetic_run(tmp_path / "run")
    command = ("plot", str(tmp_path / "run"))
    ok = run_podrace(
        *command,
        *("-o", str(tmp_path / "out.png"), "--reference", "17.5:Y&T", "--reference", "45:DQN"),
        timeout=100,
    )
    assert ok.returncode == 0, ok.stderr
    assert Image.open(tmp_path / "out.png").format == "PNG"
    bad = run_podrace(
        *command, "-o", str(tmp_path / "bad.png"), "--reference", "seventeen", timeout=100
    )
    assert bad.returncode == 2 and bad.stderr.splitlines() == [
        "podrace: error: --reference takes VALUE:LABEL "
        "(e.g. 17.5:\"Young & Tian AC(lambda) at 5M\"), got 'seventeen'"
    ]
    assert not (tmp_path / "bad.png").exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rollout_length", [32, 3_000, 4_096_000, 10**9])
def test_x_tick_labels_of_the_curves_never_overlap(tmp_path, rollout_length):
    """Env steps up to 2.4e5, 2.3e7, 3.1e10 and 7.7e12, with thousands separators."""
    synthetic_run(tmp_path / "run", rollout_length=rollout_length)
    fig = plot_runs([tmp_path / "run"])
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes[:2]:
        assert label_overlaps(ax.xaxis, renderer) == []
        assert len([t for t in ax.get_xticklabels() if t.get_text()]) >= 2


@pytest.mark.timeout(60)
@pytest.mark.parametrize("width", [1.5, 3.0, 6.0, 12.0])
def test_spaced_ticks_fit_axes_of_any_width(width):
    fig = Figure(figsize=(width, 2.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot([0, 12_345_678_901], [0, 1])
    ax.xaxis.set_major_formatter(lambda x, _: f"{x:,.0f}")
    ax.xaxis.set_major_locator(SpacedLocator())
    fig.canvas.draw()
    assert label_overlaps(ax.xaxis, fig.canvas.get_renderer()) == []
