"""Values as the pages show them, and the overview's chart as SVG geometry (pure)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from condmsg.console.queries import Overview
from condmsg.core.timeutil import iso, stored_instant
from condmsg.core.wording import plural

#: The chart's series, bottom to top, with their colours.
SERIES = (("satisfied", "#2e7d32"), ("violated", "#c62828"), ("pending", "#f9a825"))
WIDTH, HEIGHT, LEFT, BOTTOM = 720, 200, 40, 24
DASH = "\u2013"  # an en dash: no value


def instant(value: datetime | None) -> str:
    """ISO 8601 UTC with milliseconds, or an en dash."""
    return DASH if value is None else iso(stored_instant(value))


def seconds(value: float | None) -> str:
    """A duration with its unit: ``350 ms``, ``1.25 s``, ``2.0 min``, or an en dash."""
    if value is None:
        return DASH
    if abs(value) < 1:
        return f"{value * 1000:,.0f} ms"
    if abs(value) < 120:
        return f"{value:,.2f} s"
    if abs(value) < 7200:
        return f"{value / 60:,.1f} min"
    return f"{value / 3600:,.1f} h"


def count(value: int | None) -> str:
    return DASH if value is None else f"{value:,}"


FILTERS = {"instant": instant, "seconds": seconds, "count": count, "plural": plural}


def chart(view: Overview) -> dict[str, Any]:
    """Stacked bars, one per time bucket, as rectangles with their titles, plus the axis
    labels (UTC): everything the template needs to draw the SVG."""
    top = max([sum(bar.values()) for bar in view.chart] + [1])
    plot_w, plot_h = WIDTH - LEFT - 8, HEIGHT - BOTTOM - 8
    bar_w = plot_w / max(len(view.chart), 1)
    step = (view.window_end - view.window_start) / max(len(view.chart), 1)
    rects = []
    for index, bar in enumerate(view.chart):
        y = float(HEIGHT - BOTTOM)
        start = view.window_start + step * index
        for name, colour in SERIES:
            n = bar.get(name, 0)
            if not n:
                continue
            h = plot_h * n / top
            y -= h
            rects.append(
                {
                    "x": round(LEFT + index * bar_w + 1, 1),
                    "y": round(y, 1),
                    "w": round(max(bar_w - 2, 1), 1),
                    "h": round(h, 1),
                    "fill": colour,
                    "title": f"{name}: {n:,} sent from {iso(start)}",
                }
            )
    span = view.window_end - view.window_start
    ticks = [
        {"x": LEFT + plot_w * frac, "label": iso(view.window_start + span * frac)[:16] + "Z"}
        for frac in (0.0, 0.5, 1.0)
    ]
    return {
        "width": WIDTH,
        "height": HEIGHT,
        "left": LEFT,
        "base": HEIGHT - BOTTOM,
        "top_label": f"{top:,}",
        "rects": rects,
        "ticks": ticks,
        "series": SERIES,
    }
