"""Small inline-SVG charts for the self-contained report (no JavaScript, no CDN)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

WIDTH, HEIGHT = 640, 220
PAD_LEFT, PAD_BOTTOM, PAD_TOP = 56, 48, 24
COLORS = ("#2b8a3e", "#c92a2a", "#868e96", "#1c7ed6", "#e67700")


def _frame(title: str, body: list[str], height: int = HEIGHT) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{escape(title)}">'
        f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" font-size="13">{escape(title)}</text>'
        + "".join(body)
        + "</svg>"
    )


def _empty(title: str) -> str:
    return _frame(
        title, [f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">no data</text>']
    )


def stacked_bars(title: str, labels: Sequence[str], series: Mapping[str, Sequence[float]]) -> str:
    """Vertical bars, one per label, stacking the series (a legend names them)."""
    if not labels:
        return _empty(title)
    totals = [sum(values[i] for values in series.values()) for i in range(len(labels))]
    top = max(totals) or 1.0
    plot_w, plot_h = WIDTH - PAD_LEFT - 8, HEIGHT - PAD_BOTTOM - PAD_TOP
    step = plot_w / len(labels)
    body = [
        f'<line x1="{PAD_LEFT}" y1="{PAD_TOP + plot_h}" x2="{WIDTH - 8}" y2="{PAD_TOP + plot_h}" '
        'stroke="#333"/>',
        f'<text x="{PAD_LEFT - 4}" y="{PAD_TOP + 8}" text-anchor="end" font-size="10">'
        f"{top:g}</text>",
    ]
    for i, label in enumerate(labels):
        y = float(PAD_TOP + plot_h)
        for (name, values), color in zip(series.items(), COLORS, strict=False):
            h = plot_h * values[i] / top
            y -= h
            body.append(
                f'<rect x="{PAD_LEFT + i * step + 1:.1f}" y="{y:.1f}" '
                f'width="{max(step - 2, 1):.1f}" '
                f'height="{h:.1f}" fill="{color}"><title>{escape(label)} {escape(name)}: '
                f"{values[i]:g}</title></rect>"
            )
        if len(labels) <= 24 or i % max(1, len(labels) // 12) == 0:
            body.append(
                f'<text x="{PAD_LEFT + (i + 0.5) * step:.1f}" y="{PAD_TOP + plot_h + 14}" '
                f'text-anchor="middle" font-size="9">{escape(label)}</text>'
            )
    for j, (name, color) in enumerate(zip(series, COLORS, strict=False)):
        x = PAD_LEFT + j * 110
        body.append(f'<rect x="{x}" y="{HEIGHT - 14}" width="10" height="10" fill="{color}"/>')
        body.append(f'<text x="{x + 14}" y="{HEIGHT - 5}" font-size="10">{escape(name)}</text>')
    return _frame(title, body)


def diverging_bars(title: str, rows: Sequence[tuple[str, float]], unit: str = "ms") -> str:
    """Horizontal bars around zero: negative to the left, positive to the right."""
    if not rows:
        return _empty(title)
    height = PAD_TOP + 20 * len(rows) + 24
    extent = max(abs(v) for _, v in rows) or 1.0
    left, right = 160, WIDTH - 16
    zero = (left + right) / 2
    half = (right - left) / 2
    body = [f'<line x1="{zero}" y1="{PAD_TOP}" x2="{zero}" y2="{height - 20}" stroke="#333"/>']
    for i, (label, value) in enumerate(rows):
        y = PAD_TOP + 20 * i
        w = half * abs(value) / extent
        x = zero - w if value < 0 else zero
        color = COLORS[1] if value < 0 else COLORS[3] if value > 0 else COLORS[2]
        body.append(
            f'<text x="{left - 6}" y="{y + 13}" text-anchor="end" font-size="10">'
            f"{escape(label)}</text>"
            f'<rect x="{x:.1f}" y="{y + 3}" width="{max(w, 1):.1f}" height="14" fill="{color}">'
            f"<title>{escape(label)}: {value:+g} {unit}</title></rect>"
        )
    body.append(
        f'<text x="{left}" y="{height - 6}" font-size="10">behind by {extent:g} {unit}</text>'
        f'<text x="{right}" y="{height - 6}" text-anchor="end" font-size="10">'
        f"ahead by {extent:g} {unit}</text>"
    )
    return _frame(title, body, height)
