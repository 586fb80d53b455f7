"""Small inline-SVG charts for the self-contained report (no JavaScript, no CDN).

Every chart names its axes and their units; a bar's exact value is in its tooltip
(``<title>``). The page scales a chart down to its column (``max-width: 100%``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from html import escape

from spark_audit.report_values import count

WIDTH, HEIGHT = 640, 260
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 64, 12, 28, 64
COLORS = ("#2b8a3e", "#c92a2a", "#868e96", "#1c7ed6", "#e67700")
#: Width of one character of a 10 px label, to keep axis labels from overlapping.
CHAR_PX = 6.0

Format = Callable[[float], str]


def _frame(title: str, body: list[str], width: int, height: int) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">'
        f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13" '
        f'font-weight="600">{escape(title)}</text>' + "".join(body) + "</svg>"
    )


def _empty(title: str, width: int) -> str:
    return _frame(
        title,
        [f'<text x="{width / 2}" y="{HEIGHT / 2}" text-anchor="middle">no data</text>'],
        width,
        HEIGHT,
    )


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is at least ``value``: a
    round top for an axis."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return float(next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= value))


def stacked_bars(
    title: str,
    labels: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    x_title: str,
    y_title: str,
    width: int = WIDTH,
) -> str:
    """Vertical bars, one per label, stacking the series (a legend names them), with a
    y axis of three ticks and as many x labels as fit without overlapping."""
    if not labels:
        return _empty(title, width)
    totals = [sum(values[i] for values in series.values()) for i in range(len(labels))]
    top = nice_ceiling(max(totals))
    plot_w, plot_h = width - PAD_LEFT - PAD_RIGHT, HEIGHT - PAD_BOTTOM - PAD_TOP
    base = PAD_TOP + plot_h
    step = plot_w / len(labels)
    body: list[str] = []
    for tick in (0.0, top / 2, top):
        y = base - plot_h * tick / top
        body.append(
            f'<line x1="{PAD_LEFT}" y1="{y:.1f}" x2="{width - PAD_RIGHT}" y2="{y:.1f}" '
            f'stroke="{"#333" if tick == 0 else "#dee2e6"}"/>'
            f'<text x="{PAD_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="10">'
            f"{count(tick)}</text>"
        )
    body.append(
        f'<text transform="translate(14 {PAD_TOP + plot_h / 2}) rotate(-90)" '
        f'text-anchor="middle" font-size="11">{escape(y_title)}</text>'
    )
    widest = max(len(label) for label in labels) * CHAR_PX + 8
    every = max(1, math.ceil(len(labels) * widest / plot_w))
    for i, label in enumerate(labels):
        y = float(base)
        for (name, values), color in zip(series.items(), COLORS, strict=False):
            h = plot_h * values[i] / top
            y -= h
            body.append(
                f'<rect x="{PAD_LEFT + i * step + 1:.1f}" y="{y:.1f}" '
                f'width="{max(step - 2, 1):.1f}" height="{h:.1f}" fill="{color}">'
                f"<title>{escape(label)} {escape(name)}: {count(values[i])}</title></rect>"
            )
        if i % every == 0:
            body.append(
                f'<text x="{PAD_LEFT + (i + 0.5) * step:.1f}" y="{base + 14}" '
                f'text-anchor="middle" font-size="10">{escape(label)}</text>'
            )
    body.append(
        f'<text x="{PAD_LEFT + plot_w / 2}" y="{base + 32}" text-anchor="middle" '
        f'font-size="11">{escape(x_title)}</text>'
    )
    if len(series) > 1:
        for j, (name, color) in enumerate(zip(series, COLORS, strict=False)):
            x = PAD_LEFT + j * 110
            body.append(
                f'<rect x="{x}" y="{HEIGHT - 14}" width="10" height="10" fill="{color}"/>'
                f'<text x="{x + 14}" y="{HEIGHT - 5}" font-size="10">{escape(name)}</text>'
            )
    return _frame(title, body, width, HEIGHT)


def diverging_bars(
    title: str, rows: Sequence[tuple[str, float]], fmt: Format, width: int = WIDTH
) -> str:
    """Horizontal bars around zero, negative to the left and positive to the right, each
    with its value written beside it."""
    if not rows:
        return _empty(title, width)
    height = PAD_TOP + 20 * len(rows) + 28
    extent = max(abs(v) for _, v in rows) or 1.0
    # Room for the labels on the left and for a value beside the longest bar either side.
    left, right = 210, width - 70
    zero = (left + right) / 2
    half = (right - left) / 2
    body = [f'<line x1="{zero}" y1="{PAD_TOP}" x2="{zero}" y2="{height - 24}" stroke="#333"/>']
    for i, (label, value) in enumerate(rows):
        y = PAD_TOP + 20 * i
        w = half * abs(value) / extent
        x = zero - w if value < 0 else zero
        color = COLORS[1] if value < 0 else COLORS[3] if value > 0 else COLORS[2]
        text_x, anchor = (x - 4, "end") if value < 0 else (x + max(w, 1) + 4, "start")
        body.append(
            f'<text x="{left - 64}" y="{y + 14}" text-anchor="end" font-size="10">'
            f"{escape(label)}</text>"
            f'<rect x="{x:.1f}" y="{y + 3}" width="{max(w, 1):.1f}" height="14" fill="{color}">'
            f"<title>{escape(label)}: {escape(fmt(value))}</title></rect>"
            f'<text x="{text_x:.1f}" y="{y + 14}" text-anchor="{anchor}" font-size="10">'
            f"{escape(fmt(value)) if value else ''}</text>"
        )
    body.append(
        f'<text x="{left}" y="{height - 8}" font-size="10">behind by {escape(fmt(extent))}'
        f'</text><text x="{zero}" y="{height - 8}" text-anchor="middle" font-size="10">'
        f'0</text><text x="{right}" y="{height - 8}" text-anchor="end" font-size="10">'
        f"ahead by {escape(fmt(extent))}</text>"
    )
    return _frame(title, body, width, height)
