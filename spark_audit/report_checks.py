"""The top of ``report.html``: the overall status, then the failing checks (errors before
warnings) with what each found, what it allows, what it means and where its rows are."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from spark_audit.report_values import MISSING, count, metric

#: The status as the report's banner says it, and the exit code ``condmsg audit`` gives.
STATUS_LABELS = {"pass": "PASS", "warn": "PASS WITH WARNINGS", "fail": "FAIL"}
EXIT_CODES = {"pass": 0, "warn": 0, "fail": 1}

#: The report's section that shows the rows behind a check, by the check's metric.
EVIDENCE_SECTIONS = {
    "discrepancies": "discrepancies",
    "sphere_discrepancies": "spheres",
    "sphere_member_mismatches": "spheres",
    "sphere_early_releases": "spheres",
    "counted_after_decision": "status-mismatches",
    "not_counted_while_pending": "status-mismatches",
    "not_counted_before_decision": "status-mismatches",
    "late_acks_changing_verdict": "late-acks",
    "late_ack_flag_mismatches": "late-acks",
    "stale_pending": "stale-pending",
    "deadline_miss_rate": "destinations",
    "max_proven_skew_ms": "receivers",
    "relay_p99_ms": "receivers",
}
#: The table under ``tables/`` that lists a check's rows, by the check's metric.
EVIDENCE_TABLES = {
    "discrepancies": "discrepancies",
    "invalid_conditions": "invalid_conditions",
    "malformed_acks": "malformed_acks",
    "counted_after_decision": "status_mismatches",
    "not_counted_while_pending": "status_mismatches",
    "not_counted_before_decision": "status_mismatches",
    "late_acks_changing_verdict": "late_ack_effects",
    "late_ack_flag_mismatches": "late_ack_effects",
    "orphan_acks": "orphan_acks",
    "duplicate_ack_rate": "duplicate_acks",
    "multiple_consumptions": "multiple_consumptions",
    "stale_pending": "stale_pending",
    "deadline_miss_rate": "destinations",
    "max_proven_skew_ms": "receivers",
    "relay_p99_ms": "receivers",
    "sphere_discrepancies": "sphere_discrepancies",
    "sphere_member_mismatches": "sphere_discrepancies",
    "sphere_early_releases": "sphere_early_releases",
}


#: The columns of a check's table that hold what the check measures, by its metric. A
#: failing check's columns come first in the report's table (after the column naming the
#: row), so that they are in view at 1280 px however wide the table is.
EVIDENCE_COLUMNS = {
    "discrepancies": ("stored_verdict", "recomputed_verdict", "python_verdict"),
    "counted_after_decision": ("problem", "status"),
    "not_counted_while_pending": ("problem", "status"),
    "not_counted_before_decision": ("problem", "status"),
    "late_acks_changing_verdict": ("changes_verdict", "verdict_counted", "verdict_with_late"),
    "late_ack_flag_mismatches": ("changes_verdict", "flagged"),
    "stale_pending": ("evaluation_deadline",),
    "deadline_miss_rate": ("pickup_miss_rate", "process_miss_rate"),
    "max_proven_skew_ms": ("behind_by_at_least_ms", "ahead_by_at_least_ms", "skew_proved"),
    "relay_p99_ms": ("relay_p99_ms",),
    "sphere_discrepancies": ("stored_verdict", "recomputed_verdict", "agrees"),
    "sphere_member_mismatches": ("members_recorded", "members_found"),
    "sphere_early_releases": ("released_at", "sphere_decided_at"),
}


def checked_columns(
    checks: Sequence[Mapping[str, Any]], table: str
) -> dict[str, Mapping[str, Any]]:
    """The columns of ``table`` that failing checks are about, each with its check, in the
    order they are to be shown: an error's before a warning's."""
    failed = sorted(
        (c for c in checks if not c["passed"] and EVIDENCE_TABLES.get(c["metric"]) == table),
        key=lambda c: c["severity"] != "error",
    )
    found: dict[str, Mapping[str, Any]] = {}
    for check in failed:
        for column in EVIDENCE_COLUMNS.get(check["metric"], ()):
            found.setdefault(column, check)
    return found


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def status_banner(status: str, checks: Sequence[Mapping[str, Any]]) -> str:
    """The status in words, with how many checks failed and the exit code."""
    failed = [c for c in checks if not c["passed"]]
    errors = sum(c["severity"] == "error" for c in failed)
    warnings = len(failed) - errors
    if not failed:
        detail = f"all {len(checks)} checks passed"
    else:
        parts = [plural(errors, "error check")] if errors else []
        parts += [plural(warnings, "warning")] if warnings else []
        detail = " and ".join(parts) + f" of {len(checks)} checks failed"
    label = STATUS_LABELS.get(status, status.upper())
    return (
        f"<div class='banner {escape(status)}' id='status'><span class='status'>"
        f"{escape(label)}</span><span>{escape(detail)}; <code>condmsg audit</code> exits "
        f"with {EXIT_CODES.get(status, 2)}</span></div>"
    )


def _where(check: Mapping[str, Any], tables: Mapping[str, Mapping[str, Any]]) -> str:
    links = []
    section = EVIDENCE_SECTIONS.get(check["metric"])
    if section:
        links.append(f"<a href='#{section}'>below</a>")
    name = EVIDENCE_TABLES.get(check["metric"])
    if name and name in tables:
        rows = tables[name].get("rows")
        size = f" ({plural(int(rows), 'row')})" if rows is not None else ""
        links.append(f"<code>tables/{escape(name)}</code>{size}")
    return "; ".join(links) or MISSING


def _row(check: Mapping[str, Any], tables: Mapping[str, Mapping[str, Any]]) -> str:
    severity = "error" if check["severity"] == "error" else "warning"
    name = check["metric"]
    return (
        f"<tr class='{severity}'><td><span class='badge {severity}'>{severity}</span></td>"
        f"<td><b>{escape(check['name'])}</b></td>"
        f"<td class='num'>{metric(name, check['observed'])}</td>"
        f"<td class='num'>{metric(name, check['threshold'])}</td>"
        f"<td class='text'>{escape(check['description'])}</td>"
        f"<td class='text'>{_where(check, tables)}</td></tr>"
    )


_HEAD = (
    "<tr><th>severity</th><th>check</th><th>found</th><th>allowed (at most)</th>"
    "<th>what it means</th><th>rows</th></tr>"
)


def failing_checks(
    checks: Sequence[Mapping[str, Any]], tables: Mapping[str, Mapping[str, Any]]
) -> str:
    """The failed checks, errors first, then every check behind a disclosure."""
    failed = [c for c in checks if not c["passed"]]
    failed.sort(key=lambda c: c["severity"] != "error")
    if failed:
        body = "".join(_row(c, tables) for c in failed)
        listing = (
            f"<div class='scroll'><table class='checks' id='failing'>{_HEAD}{body}</table></div>"
        )
    else:
        listing = "<p id='failing'>Every check passed.</p>"
    every = "".join(
        f"<tr><td>{'ok' if c['passed'] else escape(c['severity'])}</td>"
        f"<td>{escape(c['name'])}</td><td class='num'>{metric(c['metric'], c['observed'])}</td>"
        f"<td class='num'>{metric(c['metric'], c['threshold'])}</td>"
        f"<td class='text'>{escape(c['description'])}</td></tr>"
        for c in checks
    )
    passed = len(checks) - len(failed)
    return (
        f"<h2>Failing checks ({count(len(failed))})</h2>{listing}"
        f"<details><summary>All {len(checks)} checks ({passed} passed)</summary>"
        "<div class='scroll'><table><tr><th>result</th><th>check</th><th>found</th>"
        f"<th>allowed (at most)</th><th>what it checks</th></tr>{every}</table></div></details>"
    )
