"""The report's charts and tables as ``render`` writes them (no Spark, no browser): a
histogram draws every bin of its range, a chart with nothing to draw is one line, and the
columns a failing check is about come first in its table."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from html import escape
from itertools import pairwise
from typing import Any

from spark_audit.report import render
from tests.spark.report_inputs import summary, wide_collected

SVG = "{http://www.w3.org/2000/svg}"


def _chart(html: str, title: str) -> ET.Element | None:
    found = re.search(rf'<svg [^>]*aria-label="{re.escape(escape(title))}".*?</svg>', html, re.S)
    return ET.fromstring(found.group(0)) if found else None


def _bars(chart: ET.Element) -> list[tuple[str, float, float]]:
    """``(tooltip, x, height)`` of every bar, left to right."""
    return [
        (rect.findtext(f"{SVG}title") or "", float(rect.get("x", 0)), float(rect.get("height", 0)))
        for rect in chart.iter(f"{SVG}rect")
        if rect.find(f"{SVG}title") is not None
    ]


def _hist(*bins: tuple[str, int, int]) -> dict[str, list[dict[str, Any]]]:
    return {"latency_histogram": [{"metric": m, "bin": b, "count": n} for m, b, n in bins]}


def test_a_histogram_draws_every_bin_of_its_range_empty_ones_at_zero_height() -> None:
    html = render(summary(), _hist(("pickup", -1, 4), ("pickup", 2, 8), ("pickup", 5, 2)))
    chart = _chart(html, "pickup latency after sent_at")
    assert chart is not None
    bars = _bars(chart)
    assert [tooltip for tooltip, _, _ in bars] == [
        "<0 acks: 4",
        "<1 ms acks: 0",
        "<2 ms acks: 0",
        "<4 ms acks: 8",
        "<8 ms acks: 0",
        "<16 ms acks: 0",
        "<32 ms acks: 2",
    ]
    assert [h == 0 for _, _, h in bars] == [False, True, True, False, True, True, False]
    # One step per bin: each bar is where its bin is on the doubling axis.
    steps = [b[1] - a[1] for a, b in pairwise(bars)]
    assert max(steps) - min(steps) < 0.2, steps
    labels = [t.text for t in chart.iter(f"{SVG}text")]
    assert "<1 ms" in labels and "<32 ms" in labels


def test_a_histogram_starts_and_ends_at_its_fullest_bins() -> None:
    html = render(summary(), _hist(("process", 7, 1), ("process", 9, 3), ("pickup", 1, 1)))
    chart = _chart(html, "process latency after sent_at")
    assert chart is not None
    tooltips = [tooltip for tooltip, _, _ in _bars(chart)]
    assert tooltips == ["<128 ms acks: 1", "<256 ms acks: 0", "<512 ms acks: 3"]


def _notes(html: str) -> list[str]:
    return re.findall(r"<p class='note'>([^<]*)</p>", html)


def test_charts_with_nothing_to_draw_say_so_in_one_line() -> None:
    html = render(summary(), {})
    for title in (
        "pickup latency after sent_at",
        "process latency after sent_at",
        "CM outcomes by the time they were sent",
        "proven receiver clock offset from the sender's (at least)",
    ):
        assert _chart(html, title) is None, title
    notes = _notes(html)
    assert "No pickup latency in the window: no histogram to draw." in notes
    assert "No process latency in the window: no histogram to draw." in notes
    assert "No CM sent in the window: no outcomes to draw." in notes
    assert "No receiver acked in the window: no clock offset to draw." in notes


def _receiver(name: str, behind_ms: float, ahead_ms: float) -> dict[str, Any]:
    return {
        "receiver": name,
        "acks": 10,
        "behind_by_at_least_ms": behind_ms,
        "ahead_by_at_least_ms": ahead_ms,
    }


def test_no_clock_chart_when_the_acks_prove_no_offset() -> None:
    receivers = [_receiver("rcv-a", 0.0, 0.0), _receiver("rcv-b", 0.0, 0.0)]
    html = render(summary(), {"receivers": receivers})
    assert _chart(html, "proven receiver clock offset from the sender's (at least)") is None
    assert (
        "The acks prove no receiver&#x27;s clock ahead of or behind the sender&#x27;s "
        "(2 receivers): no clock offset to draw."
    ) in _notes(html)


def test_the_clock_chart_draws_only_the_receivers_with_a_proven_offset() -> None:
    receivers = [
        _receiver("rcv-a", 0.0, 0.0),
        _receiver("rcv-behind", 2990.5, 0.0),
        _receiver("rcv-ahead", 0.0, 1500.0),
    ]
    html = render(summary(), {"receivers": receivers})
    chart = _chart(html, "proven receiver clock offset from the sender's (at least)")
    assert chart is not None
    assert [tooltip for tooltip, _, _ in _bars(chart)] == [
        "rcv-behind: -2.99 s",
        "rcv-ahead: 1.50 s",
    ]
    assert "No offset proven for the other 1 receiver (see the table)." in _notes(html)


def _headers(html: str, section: str) -> list[str]:
    body = html[html.index(f"<section id='{section}'>") :]
    first_row = body[: body.index("</tr>")]
    return re.findall(r"<th[^>]*>([^<]*)</th>", first_row)


def test_a_failing_checks_columns_come_first_in_its_table() -> None:
    html = render(summary(["deadline_miss_rate", "clock_skew"]), wide_collected())
    assert _headers(html, "destinations")[:3] == [
        "destination",
        "pickup miss rate",
        "process miss rate",
    ]
    assert _headers(html, "receivers")[:4] == [
        "receiver",
        "behind by at least",
        "ahead by at least",
        "skew proved",
    ]
    assert "<th class='checked warning' title='failing check: clock_skew'>" in html
    # A check that passed leaves its table's columns in their order.
    assert _headers(html, "discrepancies")[:4] == ["cm id", "sender", "shape", "stored verdict"]


def test_an_errors_columns_come_before_a_warnings() -> None:
    html = render(summary(["relay_lag", "clock_skew"]), wide_collected())
    assert _headers(html, "receivers")[:3] == [
        "receiver",
        "behind by at least",
        "ahead by at least",
    ]
    failed = summary(["relay_lag", "clock_skew"])
    for check in failed["checks"]:
        if check["name"] == "relay_lag":
            check["severity"] = "error"
    html = render(failed, wide_collected())
    assert _headers(html, "receivers")[:3] == ["receiver", "relay p99", "behind by at least"]
    assert "<th class='checked error' title='failing check: relay_lag'>relay p99</th>" in html
