"""The versioned ``summary.json``: totals, metrics, checks, table row counts.

Schema (``"schema": "condmsg.audit.summary"``, ``"version"`` =
:data:`spark_audit.SUMMARY_VERSION`; a new key is a compatible change, a renamed or
removed one bumps the version)::

    {"schema", "version", "status": "pass" | "warn" | "fail", "generated_at",
     "window": {"since", "until"}, "source", "spark": {"version", "master"},
     "totals": {"cms", "decided", "pending", "native_cms", "shapes", "acks"},
     "spheres": {"spheres", "decided", "satisfied", "violated", "disagreements",
                 "member_mismatches", "early_releases"},
     "metrics": {<metric>: number | null}, "checks": [{"name", "severity", "metric",
     "threshold", "observed", "passed", "description"}], "latency": {<overall p50/p90/p99>},
     "tables": {<name>: {"path", "rows"}}, "timings_s": {<step>: seconds}}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import SparkSession

from condmsg.core.timeutil import utcnow
from spark_audit.checks import CheckResult
from spark_audit.readers import Window
from spark_audit.versions import SUMMARY_VERSION

SCHEMA_NAME = "condmsg.audit.summary"


def _sum(rows: list[dict[str, Any]], key: str) -> float:
    return float(sum(r.get(key) or 0 for r in rows))


def metrics_from(
    totals: Mapping[str, Any],
    counts: Mapping[str, int],
    collected: Mapping[str, list[dict[str, Any]]],
) -> dict[str, float | int | None]:
    """The numbers the checks judge, from the totals and the written tables."""
    destinations = collected.get("destinations", [])
    deadlines = _sum(destinations, "pickup_deadlines") + _sum(destinations, "process_deadlines")
    misses = _sum(destinations, "pickup_misses") + _sum(destinations, "process_misses")
    receivers = collected.get("receivers", [])
    skew = max(
        (max(r["behind_by_at_least_ms"] or 0, r["ahead_by_at_least_ms"] or 0) for r in receivers),
        default=None,
    )
    overall = [r for r in collected.get("latency", []) if r["level"] == "all"]
    acks = int(totals.get("acks") or 0)
    mismatched_flags = None
    changing = None
    effects = counts.get("late_ack_effects")
    if effects is not None:
        changing = counts.get("metric:late_acks_changing_verdict")
        mismatched_flags = counts.get("metric:late_ack_flag_mismatches")
    return {
        "discrepancies": counts.get("discrepancies"),
        "invalid_conditions": counts.get("invalid_conditions"),
        "malformed_acks": counts.get("malformed_acks"),
        "counted_after_decision": counts.get("status:counted_after_decision"),
        "not_counted_while_pending": counts.get("status:not_counted_while_pending"),
        "not_counted_before_decision": counts.get("status:not_counted_before_decision"),
        "late_acks": counts.get("late_acks"),
        "late_acks_changing_verdict": changing,
        "late_ack_flag_mismatches": mismatched_flags,
        "orphan_acks": counts.get("orphan_acks"),
        "duplicate_acks": counts.get("duplicate_acks"),
        "duplicate_ack_rate": (counts.get("duplicate_acks", 0) / acks) if acks else None,
        "multiple_consumptions": counts.get("multiple_consumptions"),
        "stale_pending": counts.get("stale_pending"),
        "deadline_miss_rate": misses / deadlines if deadlines else None,
        "max_proven_skew_ms": skew,
        "relay_p99_ms": overall[0]["relay_p99_ms"] if overall else None,
        "sphere_discrepancies": counts.get("metric:sphere_disagreements"),
        "sphere_member_mismatches": counts.get("metric:sphere_member_mismatches"),
        "sphere_early_releases": counts.get("sphere_early_releases"),
    }


def build_summary(
    *,
    status: str,
    window: Window,
    source: str,
    spark: SparkSession,
    totals: Mapping[str, Any],
    metrics: Mapping[str, Any],
    checks: list[CheckResult],
    counts: Mapping[str, int],
    collected: Mapping[str, list[dict[str, Any]]],
    timings: Mapping[str, float],
    spheres: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    overall = [r for r in collected.get("latency", []) if r["level"] == "all"]
    latency = {k: v for k, v in overall[0].items() if k.endswith("_ms")} if overall else {}
    return {
        "schema": SCHEMA_NAME,
        "version": SUMMARY_VERSION,
        "status": status,
        "generated_at": utcnow().isoformat(),
        "window": {
            "since": window.since.isoformat() if window.since else None,
            "until": window.until.isoformat(),
        },
        "source": source,
        "spark": {"version": spark.version, "master": spark.sparkContext.master},
        "totals": dict(totals),
        "spheres": dict(spheres or {}),
        "metrics": dict(metrics),
        "checks": [c.as_dict() for c in checks],
        "latency": latency,
        "tables": {
            name: {"path": f"tables/{name}", "rows": rows}
            for name, rows in counts.items()
            if ":" not in name
        },
        "timings_s": dict(timings),
    }
