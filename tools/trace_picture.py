"""Draw one trace of condmsg's spans as an SVG waterfall (docs/tracing.md's picture).

    python tools/trace_picture.py SPANS_DIR OUT.svg [--title TEXT]

``SPANS_DIR`` holds ``spans-<pid>.jsonl`` files, one per process, one span a line as the
OpenTelemetry SDK's ``ReadableSpan.to_json`` writes it (what ``tests/e2e/test_tracing.py``
exports: run it with ``--basetemp DIR`` to keep them). The trace drawn is the one of the
first ``send`` span. Each row is a span, indented under its parent and coloured by the
process that recorded it; the decision's links to the acks it counted are drawn as
arcs. Standard library only.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from html import escape
from pathlib import Path
from typing import Any

ROW, LEFT, WIDTH, TOP = 22, 430, 1180, 56
COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1", "#edc948", "#9c755f")


def _instant(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _process_name(spans: list[dict[str, Any]]) -> str:
    """What a process was, from the spans it recorded."""
    names = {s["name"].split(" ")[0] for s in spans}
    if "send" in names:
        return "sending app"
    if "decide" in names or "process" in names:
        return "evaluator"
    if names <= {"publish"}:
        return "relay"
    queues = {
        s["attributes"].get("messaging.destination.name", "")
        for s in spans
        if "receive" in s["name"]
    }
    return "receiver " + ", ".join(sorted(q.rsplit(".", 1)[-1] for q in queues if q))


def load(directory: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted(directory.glob("spans-*.jsonl")):
        spans = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        process = _process_name(spans)
        for span in spans:
            span["process"] = process
        found += spans
    return found


def ordered(spans: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """The trace of the first send span, depth first, children by start time."""
    send = next(s for s in spans if s["name"].startswith("send "))
    trace = [s for s in spans if s["context"]["trace_id"] == send["context"]["trace_id"]]
    children: dict[str | None, list[dict[str, Any]]] = {}
    for span in trace:
        children.setdefault(span["parent_id"], []).append(span)
    out: list[tuple[int, dict[str, Any]]] = []

    def visit(span: dict[str, Any], depth: int) -> None:
        out.append((depth, span))
        for child in sorted(
            children.get(span["context"]["span_id"], []), key=lambda s: s["start_time"]
        ):
            visit(child, depth + 1)

    ids = {s["context"]["span_id"] for s in trace}
    for root in sorted(
        (s for s in trace if s["parent_id"] not in ids), key=lambda s: s["start_time"]
    ):
        visit(root, 0)
    return out


def label(span: dict[str, Any]) -> str:
    a = span["attributes"]
    name = span["name"]
    for word in ("receive", "settle", "publish", "process"):
        if name.startswith(word + " "):
            target = name.split(" ", 1)[1].rsplit(".", 1)[-1]
            name = f"{word} {target}"
    if "condmsg.kind" in a and a["condmsg.kind"] != "original":
        name += f" ({a['condmsg.kind']})"
    if "condmsg.verdict" in a:
        name += f": {a['condmsg.verdict']}"
    if "condmsg.ack.kind" in a and name.startswith("process"):
        name += f" ({a['condmsg.ack.kind']} ack of {a['condmsg.destination'].rsplit('.', 1)[-1]})"
    return name


def svg(rows: list[tuple[int, dict[str, Any]]], title: str) -> str:
    start = min(_instant(s["start_time"]) for _, s in rows)
    end = max(_instant(s["end_time"]) for _, s in rows)
    scale = (WIDTH - LEFT - 20) / max(end - start, 1e-6)
    processes = list(dict.fromkeys(s["process"] for _, s in rows))
    colour = {p: COLOURS[i % len(COLOURS)] for i, p in enumerate(processes)}
    height = TOP + ROW * len(rows) + 40 + 20 * ((len(processes) + 3) // 4)
    y_of = {s["context"]["span_id"]: TOP + ROW * i for i, (_, s) in enumerate(rows)}
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        'font-family="DejaVu Sans, Arial, sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
        f'<text x="10" y="22" font-size="15" font-weight="bold">{escape(title)}</text>',
        f'<text x="{LEFT}" y="42" fill="#555">0 s</text>',
        f'<text x="{WIDTH - 20}" y="42" fill="#555" text-anchor="end">{end - start:.2f} s</text>',
    ]
    for (depth, span), y in zip(rows, y_of.values(), strict=True):
        x0 = LEFT + (_instant(span["start_time"]) - start) * scale
        w = max((_instant(span["end_time"]) - _instant(span["start_time"])) * scale, 2.0)
        fill = colour[span["process"]]
        parts.append(f'<text x="{10 + 14 * depth}" y="{y + 15}">{escape(label(span))}</text>')
        parts.append(f'<rect x="{x0:.1f}" y="{y + 4}" width="{w:.1f}" height="14" fill="{fill}"/>')
        for link in span.get("links", []):
            target = y_of.get(link["context"]["span_id"])
            if target is not None:
                parts.append(
                    f'<path d="M {x0:.1f} {y + 11} C {x0 - 60:.1f} {y + 11}, {x0 - 60:.1f} '
                    f'{target + 11}, {x0 - 4:.1f} {target + 11}" stroke="#888" fill="none" '
                    'stroke-dasharray="3,3"/>'
                )
    legend_y = TOP + ROW * len(rows) + 24
    for i, process in enumerate(processes):
        x, y = 10 + 290 * (i % 4), legend_y + 20 * (i // 4)
        parts.append(
            f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{colour[process]}"/>'
        )
        parts.append(f'<text x="{x + 18}" y="{y}">{escape(process)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("spans", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--title", default="One trace of Example 1")
    o = ap.parse_args()
    o.out.write_text(svg(ordered(load(o.spans)), o.title))


if __name__ == "__main__":
    main()
