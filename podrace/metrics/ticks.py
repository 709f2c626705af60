"""Axis ticks whose labels never overlap, however long the labels and narrow the axes.

matplotlib's default locator picks tick positions without looking at the labels, so long
labels (env steps with thousands separators: 12,500,000) on a narrow axes run into each
other. `SpacedLocator` measures the labels its axis's formatter gives, with the renderer
that draws them, and takes the most "nice" ticks whose labels keep a gap between them.
"""

from __future__ import annotations

from matplotlib.backends.backend_agg import RendererAgg
from matplotlib.ticker import Locator, MaxNLocator

GAP_PX = 6.0
"""Least space between two neighbouring labels, in pixels."""
MOST_TICKS = 10
NICE_STEPS = (1, 2, 2.5, 5, 10)


class SpacedLocator(Locator):
    """Up to MOST_TICKS ticks on an x axis at nice values, as many as fit side by side."""

    def __call__(self):
        vmin, vmax = self.axis.get_view_interval()
        return self.tick_values(vmin, vmax)

    def tick_values(self, vmin: float, vmax: float):
        low, high = sorted((vmin, vmax))
        ticks = MaxNLocator(nbins=1, steps=NICE_STEPS).tick_values(low, high)
        for bins in range(MOST_TICKS, 0, -1):
            candidate = MaxNLocator(nbins=bins, steps=NICE_STEPS).tick_values(low, high)
            if self._labels_fit(candidate, low, high):
                return candidate
        return ticks

    def _labels_fit(self, ticks, low: float, high: float) -> bool:
        """Whether the labels of the ticks inside [low, high] leave GAP_PX between them."""
        inside = [float(t) for t in ticks if low <= t <= high]
        if len(inside) < 2 or high <= low:
            return True
        axes = self.axis.axes
        # Text extents depend only on the font and the dpi: an Agg renderer of the figure's
        # dpi measures them for any canvas (a figure without one, or saving to PDF).
        renderer = RendererAgg(1, 1, axes.figure.dpi)
        pixels_per_unit = axes.get_window_extent().width / (high - low)
        formatter = self.axis.get_major_formatter()
        formatter.set_locs(inside)
        font = self.axis.get_major_ticks(1)[0].label1.get_fontproperties()
        widths = [
            renderer.get_text_width_height_descent(formatter(t, i), font, ismath=False)[0]
            for i, t in enumerate(inside)
        ]
        return all(
            (inside[i + 1] - inside[i]) * pixels_per_unit
            >= (widths[i] + widths[i + 1]) / 2 + GAP_PX
            for i in range(len(inside) - 1)
        )


def label_overlaps(axis, renderer) -> list[tuple[str, str]]:
    """Neighbouring visible tick labels of a drawn x axis whose boxes overlap."""
    low, high = sorted(axis.get_view_interval())
    labels = [
        (tick.label1.get_window_extent(renderer), tick.label1.get_text())
        for tick in axis.get_major_ticks()
        if low <= tick.get_loc() <= high and tick.label1.get_visible() and tick.label1.get_text()
    ]
    labels.sort(key=lambda item: item[0].x0)
    return [(a_text, b_text) for (a, a_text), (b, b_text) in zip(labels, labels[1:]) if a.x1 > b.x0]
