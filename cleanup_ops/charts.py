"""Server-rendered SVG bar charts for the console: axes, ticks, values.

``bar_chart`` returns the geometry; ``templates/console/_chart.html`` draws
it. No JavaScript and no library: the chart is part of the page, so it
refreshes with the page's live fragment and works without scripts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

# Left margin for the y-axis labels, bottom margin for the x-axis labels.
LEFT, RIGHT, TOP, BOTTOM = 48, 8, 14, 30


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2, 2.5, 5 x 10^n not below ``value`` (1 for 0)."""
    if value <= 0:
        return 1
    exponent = math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        candidate = step * 10**exponent
        if candidate >= value:
            return candidate
    return 10 ** (exponent + 1)  # pragma: no cover (10 always qualifies)


def compact(value: float) -> str:
    """``1250000`` → ``"1.25M"``, ``12500`` → ``"12.5k"``, ``3`` → ``"3"``."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:g}" if value == int(value) else f"{value:.3g}"


def bar_chart(
    points: Sequence[tuple[str, int | float]],
    *,
    width: int = 520,
    height: int = 170,
    x_label: str = "",
    y_label: str = "",
    ticks: int = 4,
    max_x_labels: int = 12,
) -> dict[str, Any]:
    """Geometry of a bar chart: bars with their values, a y axis with ``ticks``
    round-numbered gridlines, an x axis whose labels are thinned to at most
    ``max_x_labels``. ``points`` are (label, value) in drawing order."""
    top = nice_ceiling(max((v for _, v in points), default=0))
    if top >= 1:
        ticks = max(1, min(ticks, int(top)))  # no fractional gridlines for small counts
    plot_w = width - LEFT - RIGHT
    plot_h = height - TOP - BOTTOM
    base = TOP + plot_h
    step = plot_w / max(len(points), 1)
    gap = min(4.0, step * 0.2)
    every = max(1, math.ceil(len(points) / max_x_labels))
    show_values = len(points) <= 16
    bars = []
    for i, (text, value) in enumerate(points):
        h = round(plot_h * value / top, 1)
        x = LEFT + i * step
        bars.append(
            {
                "x": round(x + gap / 2, 1),
                "y": round(base - h, 1),
                "w": round(max(step - gap, 1), 1),
                "h": h,
                "label": text,
                "value": value,
                "value_text": compact(value),
                "tx": round(x + step / 2, 1),
                "show_label": i % every == 0,
                "show_value": show_values and value > 0,
                "vy": round(base - h - 3, 1),
            }
        )
    grid = []
    for i in range(ticks + 1):
        value = top * i / ticks
        grid.append({"y": round(base - plot_h * i / ticks, 1), "text": compact(value)})
    return {
        "width": width,
        "height": height,
        "bars": bars,
        "max": top,
        "grid": grid,
        "left": LEFT,
        "right": width - RIGHT,
        "base": base,
        "label_y": base + 14,
        "x_label": x_label,
        "x_label_x": LEFT + plot_w / 2,
        "x_label_y": height - 3,
        "y_label": y_label,
        "y_label_y": TOP + plot_h / 2,
        "empty": not any(v for _, v in points),
    }
