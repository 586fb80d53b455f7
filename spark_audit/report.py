"""``report.html``: one self-contained page (inline CSS and SVG, no scripts, no network)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from spark_audit.svg import diverging_bars, stacked_bars

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1100px}
table{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:12px}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}
th{background:#f1f3f5}td:first-child,th:first-child{text-align:left}
.pass{color:#2b8a3e}.warn{color:#e67700}.fail,.error{color:#c92a2a}
svg{display:block;margin:0.5em 0}
"""


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return escape("; ".join(str(v) for v in value))
    return escape("" if value is None else str(value))


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    if not rows:
        return "<p><em>none</em></p>"
    columns = list(columns or rows[0].keys())
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{_cell(r.get(c))}</td>" for c in columns) + "</tr>" for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _histogram(rows: list[dict[str, Any]], metric: str) -> str:
    mine = sorted((r for r in rows if r["metric"] == metric), key=lambda r: r["bin"])
    labels = [
        "<0" if r["bin"] < 0 else "<1" if r["bin"] == 0 else f"<{2 ** r['bin']}" for r in mine
    ]
    return stacked_bars(
        f"{metric} latency after sent_at (ms, power-of-two bins)",
        labels,
        {"acks": [float(r["count"]) for r in mine]},
    )


def _over_time(rows: list[dict[str, Any]]) -> str:
    labels = [str(r["bucket_start"])[5:16] for r in rows]
    series = {k: [float(r[k] or 0) for r in rows] for k in ("satisfied", "violated", "pending")}
    return stacked_bars("CM outcomes by sent_at (UTC)", labels, series)


def _skew(rows: list[dict[str, Any]]) -> str:
    values = [
        (
            str(r["receiver"]),
            float(r["ahead_by_at_least_ms"] or 0) - float(r["behind_by_at_least_ms"] or 0),
        )
        for r in rows
    ]
    return diverging_bars("proven receiver clock offset vs sender (ms)", values)


def render(summary: Mapping[str, Any], collected: Mapping[str, list[dict[str, Any]]]) -> str:
    status = str(summary["status"])
    window = summary["window"]
    checks = [{**c, "result": "ok" if c["passed"] else c["severity"]} for c in summary["checks"]]
    hist = collected.get("latency_histogram", [])
    sections = [
        f"<h1>condmsg audit: <span class='{status}'>{status.upper()}</span></h1>",
        f"<p>source {escape(str(summary['source']))}; window "
        f"[{escape(str(window['since'] or 'start'))}, {escape(str(window['until']))}); "
        f"generated {escape(str(summary['generated_at']))}</p>",
        "<h2>Totals</h2>",
        table([summary["totals"]]),
        "<h2>Checks</h2>",
        table(
            checks, ["name", "result", "severity", "metric", "observed", "threshold", "description"]
        ),
        "<h2>Latency</h2>",
        _histogram(hist, "pickup"),
        _histogram(hist, "process"),
        table([r for r in collected.get("latency", []) if r["level"] != "recipient"]),
        "<h3>Per destination and recipient</h3>",
        table([r for r in collected.get("latency", []) if r["level"] == "recipient"][:200]),
        "<h2>Outcomes</h2>",
        _over_time(collected.get("outcomes_over_time", [])),
        "<h3>By sender</h3>",
        table(collected.get("rates_by_sender", [])[:200]),
        "<h3>By condition shape</h3>",
        table(collected.get("rates_by_shape", [])[:200]),
        "<h3>By destination (with deadline misses)</h3>",
        table(collected.get("destinations", [])[:200]),
        "<h2>Receivers: clock skew and relay lag</h2>",
        _skew(collected.get("receivers", [])),
        table(collected.get("receivers", [])[:200]),
        "<h2>Discrepancies (first rows)</h2>",
        table(collected.get("discrepancies", [])),
        "<h2>Late acks that would change the verdict (first rows)</h2>",
        table([r for r in collected.get("late_ack_effects", []) if r.get("changes_verdict")]),
        "<h2>Ack status labels contradicting timestamps (first rows)</h2>",
        table(collected.get("status_mismatches", [])),
        "<h2>CMs pending past their evaluation deadline (first rows)</h2>",
        table(collected.get("stale_pending", [])),
        "<h2>Dependency-Spheres</h2>",
        table([summary["spheres"]] if summary.get("spheres") else []),
        "<h3>Spheres whose stored verdict disagrees with their members (first rows)</h3>",
        table(collected.get("sphere_discrepancies", [])),
        "<h3>Member compensations released before their sphere was decided (first rows)</h3>",
        table(collected.get("sphere_early_releases", [])),
        "<h2>Recorded anomalies</h2>",
        table(collected.get("anomaly_counts", [])),
        "<h2>Tables</h2>",
        table([{"table": k, **v} for k, v in summary["tables"].items()]),
    ]
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>condmsg audit {escape(status)}</title><style>{_CSS}</style></head><body>"
        + "\n".join(sections)
        + "</body></html>\n"
    )
