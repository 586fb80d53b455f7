"""How the audit's report writes values and axes, and its top for each status (no Spark:
the page is rendered from a summary and rows made here)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from spark_audit.report import render, time_axis
from spark_audit.report_values import cell, count, duration_ms, instant, metric, rate


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0 ms"),
        (0.128, "0.1 ms"),
        (565.4, "565 ms"),
        (-1594.0, "-1.59 s"),
        (13546.0025, "13.5 s"),
        (125_000, "2.1 min"),
        (5_400_000, "1.5 h"),
    ],
)
def test_durations_carry_their_unit(ms: float, text: str) -> None:
    assert duration_ms(ms) == text


def test_counts_rates_and_metrics() -> None:
    assert count(4805) == "4,805"
    assert count(7.0) == "7"
    assert rate(0.18710341279368892) == "18.7 %"
    assert rate(0.001040582726326743) == "0.10 %"
    assert metric("deadline_miss_rate", 0.05) == "5.00 %"
    assert metric("max_proven_skew_ms", 2990.616) == "2.99 s"
    assert metric("discrepancies", 1234.0) == "1,234"
    assert metric("relay_p99_ms", None) == "\u2013"


def test_instants_are_iso_utc_whatever_their_zone() -> None:
    plus_two = timezone(timedelta(hours=2))
    assert instant(datetime(2025, 1, 1, 2, 4, 20, tzinfo=plus_two)) == "2025-01-01T00:04:20Z"
    assert instant("2025-01-01T00:01:47.848358+00:00") == "2025-01-01T00:01:47.848Z"
    naive_local = datetime(2025, 1, 1, 0, 4, 20, tzinfo=UTC).astimezone().replace(tzinfo=None)
    assert instant(naive_local) == "2025-01-01T00:04:20Z"


def test_cells_by_column() -> None:
    at = datetime(2025, 1, 1, 0, 0, 1, tzinfo=UTC)
    assert cell("sent_at", at) == ("2025-01-01<wbr>T00:00:01Z", "time")
    assert cell("pickup_p50_ms", 1378.9) == ("1.38 s", "num")
    assert cell("success_rate", 0.5) == ("50.0 %", "num")
    assert cell("acks", 12345) == ("12,345", "num")
    assert cell("skew_proved", True) == ("yes", "")
    assert cell("recipient", None) == ("\u2013", "none")
    assert cell("cm_id", "45bedfa9-b38d-605d-efaa-3569bdb7bd65")[1] == ""
    assert cell("reasons", ["a <b>", "c"]) == ("a &lt;b&gt;; c", "text")


def test_a_time_axis_names_the_day_and_the_bucket() -> None:
    starts = [datetime(2025, 1, 1, 0, 0, s, tzinfo=UTC) for s in (0, 10, 20)]
    assert time_axis(starts) == (
        ["00:00:00", "00:00:10", "00:00:20"],
        "sent_at, UTC on 2025-01-01, buckets of 10 s",
    )
    days = [datetime(2025, 1, d, tzinfo=UTC) for d in (1, 2)]
    assert time_axis(days) == (
        ["01-01 00:00", "01-02 00:00"],
        "sent_at, UTC in 2025, buckets of 24 h",
    )


def _summary(status: str, failed: dict[str, str]) -> dict[str, Any]:
    names = ["verdicts_reproducible", "no_orphan_acks", "relay_lag"]
    metrics = {"verdicts_reproducible": "discrepancies", "no_orphan_acks": "orphan_acks"}
    return {
        "status": status,
        "generated_at": "2026-11-27T15:26:43.805752+00:00",
        "window": {"since": None, "until": "2025-01-01T00:04:20+00:00"},
        "source": "file:/data/export",
        "spark": {"version": "4.3.0", "master": "local[2]"},
        "totals": {"cms": 2500, "decided": 2435, "pending": 65, "shapes": 7, "acks": 4805},
        "spheres": {},
        "metrics": {"discrepancies": 3 if "verdicts_reproducible" in failed else 0},
        "checks": [
            {
                "name": name,
                "severity": failed.get(name, "error" if name.startswith("verdicts") else "warn"),
                "metric": metrics.get(name, "relay_p99_ms"),
                "threshold": 0 if name in metrics else 5000.0,
                "observed": 3.0 if name in failed else 0.0,
                "passed": name not in failed,
                "description": f"what {name} checks",
            }
            for name in names
        ],
        "latency": {"pickup_p99_ms": 13546.0},
        "tables": {"discrepancies": {"path": "tables/discrepancies", "rows": 3}},
    }


def test_the_top_of_the_page_says_the_status_and_lists_failures_errors_first() -> None:
    html = render(
        _summary("fail", {"no_orphan_acks": "warn", "verdicts_reproducible": "error"}), {}
    )
    assert "<span class='status'>FAIL</span>" in html
    assert "1 error check and 1 warning of 3 checks failed" in html
    assert "exits with 1" in html
    assert html.index("verdicts_reproducible") < html.index("no_orphan_acks")
    assert html.index("id='failing'") < html.index("id='figures'") < html.index("id='latency'")
    assert "<code>tables/discrepancies</code> (3 rows)" in html


def test_a_passing_audit_says_so() -> None:
    html = render(_summary("pass", {}), {})
    assert "<span class='status'>PASS</span>" in html
    assert "all 3 checks passed" in html
    assert "Every check passed." in html
    warned = render(_summary("warn", {"no_orphan_acks": "warn"}), {})
    assert "PASS WITH WARNINGS" in warned and "exits with 0" in warned
