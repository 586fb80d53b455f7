"""What ``spark_audit.report.render`` takes, made by hand (no Spark): a summary whose checks
fail as asked, and collected rows with names as long as a real deployment's, which make
the detail tables wider than a 1280 px window."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

#: The checks of the summary: name -> (metric, severity, threshold).
CHECKS = {
    "verdicts_reproducible": ("discrepancies", "error", 0.0),
    "deadline_miss_rate": ("deadline_miss_rate", "warn", 0.05),
    "clock_skew": ("max_proven_skew_ms", "warn", 1000.0),
    "relay_lag": ("relay_p99_ms", "warn", 5000.0),
}
AT = datetime(2025, 1, 1, 0, 1, 20, tzinfo=UTC)
#: A condition shape of one long token, as the audit names shapes.
SHAPE = "set(process,min_process=2)[" + ",".join(["queue(recipient)"] * 6) + "]"


def summary(failing: Iterable[str] = ()) -> dict[str, Any]:
    """A summary whose checks named in ``failing`` failed (the others passed)."""
    failed = set(failing)
    tables = ("discrepancies", "destinations", "receivers", "latency_histogram")
    return {
        "status": "fail" if failed else "pass",
        "generated_at": "2026-11-27T15:26:43+00:00",
        "window": {"since": None, "until": AT.isoformat()},
        "source": "file:/data/export",
        "spark": {"version": "4.3.0", "master": "local[2]"},
        "totals": {"cms": 12_345_678, "decided": 12_000_000, "pending": 345_678, "acks": 1},
        "metrics": {"discrepancies": 2},
        "checks": [
            {
                "name": name,
                "metric": metric,
                "severity": severity,
                "threshold": threshold,
                "observed": threshold * 3 + 2 if name in failed else 0.0,
                "passed": name not in failed,
                "description": f"what {name} checks",
            }
            for name, (metric, severity, threshold) in CHECKS.items()
        ],
        "latency": {},
        "tables": {name: {"path": f"tables/{name}", "rows": 2} for name in tables},
    }


def _destination(i: int) -> dict[str, Any]:
    copies = 9_876_543 + i
    return {
        "destination": f"orders.fulfilment.eu-west-{i}.high-priority",
        "copies": copies,
        "satisfied": copies - 1_234_567,
        "violated": 1_234_567,
        "pending": 0,
        "compensated": 1_234_567,
        "pickup_deadlines": copies,
        "pickup_misses": 1_111_111,
        "process_deadlines": copies,
        "process_misses": 2_222_222,
        "success_rate": 0.875,
        "failure_rate": 0.125,
        "compensation_rate": 0.125,
        "pickup_miss_rate": 0.1125,
        "process_miss_rate": 0.225,
    }


def _receiver(i: int, behind_ms: float) -> dict[str, Any]:
    return {
        "receiver": f"receiver-orders-fulfilment-eu-west-{i}",
        "acks": 9_876_543,
        "offset_upper_ms": -behind_ms + 12.5,
        "offset_lower_ms": -behind_ms - 1.25,
        "relay_p50_ms": 1234.5,
        "relay_p90_ms": 5678.5,
        "relay_p99_ms": 12345.5,
        "behind_by_at_least_ms": behind_ms,
        "ahead_by_at_least_ms": 0.0,
        "skew_proved": behind_ms > 0,
    }


def _discrepancy(i: int) -> dict[str, Any]:
    return {
        "cm_id": f"45bedfa9-b38d-605d-efaa-3569bdb7bd6{i}",
        "sender": f"billing-service-eu-west-{i}.example.internal",
        "shape": SHAPE,
        "stored_verdict": "violated",
        "recomputed_verdict": "satisfied",
        "path": "native",
        "python_verdict": "satisfied",
        "decided_at": AT,
        "effective_at": AT,
        "counted_acks": 6,
        "reasons": ["root: processed by 2 of 6 members, at least 2 required"],
        "stored_reasons_json": '["root: processed by 1 of 6 members, at least 2 required"]',
        "error": None,
    }


def wide_collected() -> dict[str, list[dict[str, Any]]]:
    """Rows of the tables that failing checks point to, each table wider than the page."""
    return {
        "destinations": [_destination(i) for i in range(1, 4)],
        "receivers": [_receiver(1, 2990.5), _receiver(2, 0.0)],
        "discrepancies": [_discrepancy(1), _discrepancy(2)],
        "latency_histogram": [
            {"metric": "pickup", "bin": 2, "count": 5},
            {"metric": "pickup", "bin": 12, "count": 9},
        ],
    }
