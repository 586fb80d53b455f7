"""``report.html``: one self-contained page (inline CSS and SVG, no scripts, no network).

Read from the top: the status and the failing checks, the run's figures, then the charts
and tables that explain them. The page fits 1280 px: a wide table scrolls inside its own
box, never the page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from html import escape
from itertools import pairwise
from typing import Any

from spark_audit.report_checks import checked_columns, failing_checks, plural, status_banner
from spark_audit.report_values import MISSING, cell, count, duration_ms, heading, instant
from spark_audit.report_values import short_duration_ms as short
from spark_audit.svg import diverging_bars, stacked_bars

_CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,sans-serif;color:#212529;margin:0 auto;padding:20px 24px;
max-width:1240px}
h1{font-size:22px;margin:0 0 8px}h2{font-size:18px;margin:28px 0 8px;
border-bottom:1px solid #dee2e6;padding-bottom:4px}h3{font-size:15px;margin:18px 0 6px}
.banner{display:flex;gap:16px;align-items:center;flex-wrap:wrap;padding:12px 16px;
border-radius:6px;border:1px solid}
.banner .status{font-size:24px;font-weight:700}
.banner.pass{background:#ebfbee;border-color:#8ce99a;color:#2b8a3e}
.banner.warn{background:#fff9db;border-color:#ffd43b;color:#a05a00}
.banner.fail{background:#fff5f5;border-color:#ffa8a8;color:#c92a2a}
.banner span:last-child{color:#212529}
.meta{color:#495057;margin:8px 0 0}.meta b{font-weight:600;color:#212529}
.badge{display:inline-block;border-radius:3px;padding:0 6px;font-size:12px;font-weight:600;
color:#fff;text-transform:uppercase}
.badge.error{background:#c92a2a}.badge.warning{background:#e67700}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(150px,1fr));gap:8px}
.card{border:1px solid #dee2e6;border-radius:6px;padding:8px 10px}
.card .v{font-size:20px;font-weight:600}.card .k{color:#495057;font-size:12px}
nav{margin:16px 0 0;font-size:13px}nav a{margin-right:12px}
.scroll{overflow-x:auto;max-width:100%;margin:4px 0 8px}
table{border-collapse:collapse;font-size:12.5px}
td,th{border:1px solid #dee2e6;padding:3px 7px;vertical-align:top;text-align:left}
th{background:#f1f3f5;font-weight:600;min-width:4em}
td{white-space:nowrap}td.num,td.time{text-align:right;font-variant-numeric:tabular-nums}
td.time{white-space:normal}
td.text{white-space:normal;overflow-wrap:anywhere;min-width:12em;max-width:40em}
td.none{color:#adb5bd;text-align:center}
th.checked.error{background:#ffc9c9}th.checked.warning{background:#ffec99}
td.checked{background:#fff9f0}
table.checks tr.error td:first-child{border-left:4px solid #c92a2a}
table.checks tr.warning td:first-child{border-left:4px solid #e67700}
.note{color:#495057;font-size:12.5px;margin:2px 0}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:12px}
svg{max-width:100%;height:auto;display:block}
details{margin:8px 0}summary{cursor:pointer;color:#1c7ed6}
"""

#: Sections after the figures, as (anchor, title), in the page's order.
SECTIONS = (
    ("latency", "Latency"),
    ("outcomes", "Outcomes"),
    ("destinations", "Destinations and deadline misses"),
    ("receivers", "Receivers: clock skew and relay lag"),
    ("discrepancies", "Discrepancies"),
    ("late-acks", "Late acks that would change the verdict"),
    ("status-mismatches", "Ack status labels contradicting timestamps"),
    ("stale-pending", "CMs pending past their evaluation deadline"),
    ("spheres", "Dependency-Spheres"),
    ("anomalies", "Recorded anomalies"),
    ("tables", "Output tables"),
)


def _head(column: str, check: Mapping[str, Any] | None) -> str:
    if check is None:
        return f"<th>{heading(column)}</th>"
    severity = "error" if check["severity"] == "error" else "warning"
    return (
        f"<th class='checked {severity}' title='failing check: {escape(check['name'])}'>"
        f"{heading(column)}</th>"
    )


def table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str] | None = None,
    checked: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """Rows as a table in its own scrolling box; values formatted by their column.

    ``checked`` maps the columns failing checks are about to their check: those come
    right after the first column (which names the row) and are marked, so that a wide
    table does not hide them behind its scrollbar."""
    if not rows:
        return "<p class='note'><em>none</em></p>"
    columns = list(columns or rows[0].keys())
    checked = {c: check for c, check in (checked or {}).items() if c in columns[1:]}
    columns = [*columns[:1], *checked, *(c for c in columns[1:] if c not in checked)]
    head = "".join(_head(c, checked.get(c)) for c in columns)
    body = []
    for row in rows:
        tds = []
        for column in columns:
            value, kind = cell(column, row.get(column))
            kind = f"{kind} checked".strip() if column in checked else kind
            tds.append(f"<td class='{kind}'>{value}</td>")
        body.append("<tr>" + "".join(tds) + "</tr>")
    return f"<div class='scroll'><table><tr>{head}</tr>{''.join(body)}</table></div>"


def _evidence(name: str, rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]) -> str:
    """Table ``name``'s rows, the columns its failing checks are about first."""
    return table(rows, checked=checked_columns(summary["checks"], name))


def _sample(name: str, rows: list[dict[str, Any]], summary: Mapping[str, Any]) -> str:
    """A detail table's first rows, saying how many there are and where all of them are."""
    total = summary["tables"].get(name, {}).get("rows")
    if total is None or not rows:
        return _evidence(name, rows, summary)
    where = f"<code>tables/{escape(name)}</code>"
    if len(rows) < total:
        note = f"The first {count(len(rows))} of {count(total)} rows; every row is in {where}."
    else:
        note = f"All {count(len(rows))} rows, also in {where}."
    return f"<p class='note'>{note}</p>" + _evidence(name, rows, summary)


def _bin_label(b: int) -> str:
    return "<0" if b < 0 else f"<{short(2.0**b)}"


def _note(text: str) -> str:
    """One line in place of a chart that would have nothing to draw."""
    return f"<p class='note'>{escape(text)}</p>"


def _histogram(rows: list[dict[str, Any]], metric: str) -> str:
    counts = {int(r["bin"]): float(r["count"]) for r in rows if r["metric"] == metric}
    if not counts:
        return _note(f"No {metric} latency in the window: no histogram to draw.")
    # Every bin between the smallest and the largest, an empty one as a zero-height bar:
    # the bars are of one width and each bin is twice as wide as the one before, so a
    # bin left out would squeeze the axis there.
    bins = range(min(counts), max(counts) + 1)
    return stacked_bars(
        f"{metric} latency after sent_at",
        [_bin_label(b) for b in bins],
        {"acks": [counts.get(b, 0.0) for b in bins]},
        x_title="latency, upper bound of each power-of-two bin (<0: receiver clock behind)",
        y_title="acks",
    )


def time_axis(starts: Sequence[datetime]) -> tuple[list[str], str]:
    """Labels for buckets starting at ``starts`` and the axis title: times of day when
    the buckets lie in one UTC day (the title names it), else dates with times."""
    utc = [s.astimezone(UTC) for s in starts]
    steps = [(b - a).total_seconds() for a, b in pairwise(utc)]
    width = f", buckets of {short(min(steps) * 1000)}" if steps else ""
    seconds = any(t.second for t in utc)
    if len({t.date() for t in utc}) == 1:
        fmt = "%H:%M:%S" if seconds else "%H:%M"
        return [t.strftime(fmt) for t in utc], f"sent_at, UTC on {utc[0]:%Y-%m-%d}{width}"
    fmt = "%m-%d %H:%M:%S" if seconds else "%m-%d %H:%M"
    return [t.strftime(fmt) for t in utc], f"sent_at, UTC in {utc[0]:%Y}{width}"


def _over_time(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return _note("No CM sent in the window: no outcomes to draw.")
    labels, x_title = time_axis([r["bucket_start"] for r in rows])
    series = {k: [float(r[k] or 0) for r in rows] for k in ("satisfied", "violated", "pending")}
    return stacked_bars(
        "CM outcomes by the time they were sent",
        labels,
        series,
        x_title=x_title,
        y_title="CMs",
        width=1180,
    )


def _skew(rows: list[dict[str, Any]]) -> str:
    """The receivers whose acks prove their clock off the sender's, and how far at least;
    the others, whose bars would be empty, are only counted."""
    if not rows:
        return _note("No receiver acked in the window: no clock offset to draw.")
    offsets = [
        (
            str(r["receiver"]),
            float(r["ahead_by_at_least_ms"] or 0) - float(r["behind_by_at_least_ms"] or 0),
        )
        for r in rows
    ]
    proven = [(receiver, ms) for receiver, ms in offsets if ms]
    if not proven:
        return _note(
            f"The acks prove no receiver's clock ahead of or behind the sender's "
            f"({plural(len(offsets), 'receiver')}): no clock offset to draw."
        )
    chart = diverging_bars(
        "proven receiver clock offset from the sender's (at least)", proven, duration_ms
    )
    others = len(offsets) - len(proven)
    if not others:
        return chart
    return chart + _note(
        f"No offset proven for the other {plural(others, 'receiver')} (see the table)."
    )


def _figures(summary: Mapping[str, Any]) -> str:
    totals, latency = summary["totals"], summary.get("latency") or {}
    figures = [
        ("CMs in the window", totals.get("cms")),
        ("decided", totals.get("decided")),
        ("pending", totals.get("pending")),
        ("acks", totals.get("acks")),
        ("condition shapes", totals.get("shapes")),
        ("discrepancies", summary["metrics"].get("discrepancies")),
    ]
    cards = [(k, MISSING if v is None else count(v)) for k, v in figures]
    for key, label in (
        ("pickup_p50_ms", "pickup p50"),
        ("pickup_p99_ms", "pickup p99"),
        ("process_p50_ms", "process p50"),
        ("process_p99_ms", "process p99"),
        ("relay_p99_ms", "relay lag p99"),
    ):
        value = latency.get(key)
        cards.append((label, MISSING if value is None else duration_ms(value)))
    return (
        "<div class='cards'>"
        + "".join(
            f"<div class='card'><div class='v'>{v}</div><div class='k'>{escape(k)}</div></div>"
            for k, v in cards
        )
        + "</div>"
    )


def _meta(summary: Mapping[str, Any]) -> str:
    window = summary["window"]
    until = f"before {instant(window['until'])}"
    sent = f"from {instant(window['since'])} {until}" if window.get("since") else until
    spark = summary.get("spark") or {}
    return (
        f"<p class='meta'><b>window</b> CMs sent {escape(sent)} · "
        f"<b>source</b> {escape(str(summary['source']))} · "
        f"<b>generated</b> {escape(instant(summary['generated_at']))} · <b>Spark</b> "
        f"{escape(str(spark.get('version', '?')))} on {escape(str(spark.get('master', '?')))}</p>"
    )


def _sections(
    summary: Mapping[str, Any], collected: Mapping[str, list[dict[str, Any]]]
) -> dict[str, str]:
    tables = summary["tables"]
    latency = collected.get("latency", [])
    hist = collected.get("latency_histogram", [])
    per_recipient = [r for r in latency if r["level"] == "recipient"][:200]
    late = [r for r in collected.get("late_ack_effects", []) if r.get("changes_verdict")]
    return {
        "latency": f"<div class='charts'>{_histogram(hist, 'pickup')}{_histogram(hist, 'process')}"
        "</div>"
        + table([r for r in latency if r["level"] != "recipient"])
        + f"<details><summary>Per recipient ({count(len(per_recipient))} rows)</summary>"
        + table(per_recipient)
        + "</details>",
        "outcomes": _over_time(collected.get("outcomes_over_time", []))
        + "<h3>By sender</h3>"
        + table(collected.get("rates_by_sender", [])[:200])
        + "<h3>By condition shape</h3>"
        + table(collected.get("rates_by_shape", [])[:200]),
        "destinations": _evidence("destinations", collected.get("destinations", [])[:200], summary),
        "receivers": _skew(collected.get("receivers", []))
        + _evidence("receivers", collected.get("receivers", [])[:200], summary),
        "discrepancies": _sample("discrepancies", collected.get("discrepancies", []), summary),
        "late-acks": _sample("late_ack_effects", late, summary),
        "status-mismatches": _sample(
            "status_mismatches", collected.get("status_mismatches", []), summary
        ),
        "stale-pending": _sample("stale_pending", collected.get("stale_pending", []), summary),
        "spheres": table([summary["spheres"]] if summary.get("spheres") else [])
        + "<h3>Spheres whose stored verdict disagrees with their members</h3>"
        + _sample("sphere_discrepancies", collected.get("sphere_discrepancies", []), summary)
        + "<h3>Member compensations released before their sphere was decided</h3>"
        + _sample("sphere_early_releases", collected.get("sphere_early_releases", []), summary),
        "anomalies": table(collected.get("anomaly_counts", [])),
        "tables": table([{"table": k, **v} for k, v in tables.items()]),
    }


def render(summary: Mapping[str, Any], collected: Mapping[str, list[dict[str, Any]]]) -> str:
    status = str(summary["status"])
    sections = _sections(summary, collected)
    nav = "".join(f"<a href='#{anchor}'>{escape(title)}</a>" for anchor, title in SECTIONS)
    parts = [
        "<h1>condmsg audit</h1>",
        status_banner(status, summary["checks"]),
        _meta(summary),
        failing_checks(summary["checks"], summary["tables"]),
        "<h2 id='figures'>Figures</h2>",
        _figures(summary),
        f"<nav>{nav}</nav>",
        *(
            f"<section id='{anchor}'><h2>{escape(title)}</h2>{sections[anchor]}</section>"
            for anchor, title in SECTIONS
        ),
    ]
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>condmsg audit {escape(status)}</title><style>{_CSS}</style></head><body>"
        + "\n".join(parts)
        + "</body></html>\n"
    )
