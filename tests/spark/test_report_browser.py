"""``report.html`` as a reader sees it: a real audit with failing checks, opened in headless
Chromium 1280 px wide. The status and the failing checks come first, the page never
scrolls sideways, and values, instants and chart axes carry their units."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_audit.cli import EXIT_FAILED, main
from spark_audit.generate import generate
from spark_audit.generate_spec import GenerateSpec
from spark_audit.report_values import instant
from tests.spark import report_browser
from tests.spark.conftest import SPARK_MARKS

pytestmark = list(SPARK_MARKS)

#: An error (wrong verdicts) and warnings (orphans, a skewed clock, late acks).
SPEC = GenerateSpec(
    cms=700,
    seed=5,
    wrong_verdicts=2,
    late_changing=1,
    orphans=3,
    skewed_receivers={"rcv-qb": -3000},
)
DURATION = re.compile(r"^-?[\d,]+(\.\d+)? (ms|s|min|h)$")
INSTANT = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{3})?Z$")


@pytest.fixture(scope="session")
def audited_report(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("report")
    generate(spark, SPEC, root / "store")
    code = main(["--parquet", str(root / "store"), "--out", str(root / "audit"), "--quiet"])
    assert code == EXIT_FAILED
    summary = json.loads((root / "audit" / "summary.json").read_text())
    return {"report": root / "audit" / "report.html", "summary": summary}


@pytest.fixture
def page(audited_report: dict[str, Any]) -> Iterator[Any]:
    with report_browser.opened(Path(audited_report["report"])) as driver:
        yield driver


def _y(driver: Any, selector: str) -> float:
    return float(
        driver.execute_script(
            "return document.querySelector(arguments[0]).getBoundingClientRect().top"
            " + window.scrollY",
            selector,
        )
    )


def _texts(driver: Any, selector: str) -> list[str]:
    return [
        str(t)
        for t in driver.execute_script(
            "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent.trim())",
            selector,
        )
    ]


def test_the_page_fits_1280_px_without_sideways_scroll(page: Any) -> None:
    width, scroll = page.execute_script(
        "return [window.innerWidth, document.documentElement.scrollWidth]"
    )
    assert width == report_browser.WIDTH
    assert scroll <= width
    # A table wider than the page scrolls inside its own box.
    wide = page.execute_script(
        "return [...document.querySelectorAll('table')]"
        ".filter(t => t.scrollWidth > document.documentElement.clientWidth)"
        ".map(t => getComputedStyle(t.parentElement).overflowX)"
    )
    assert all(overflow == "auto" for overflow in wide)


def test_the_status_and_the_failing_checks_come_before_everything_else(
    page: Any, audited_report: dict[str, Any]
) -> None:
    summary = audited_report["summary"]
    (banner,) = _texts(page, "#status")
    assert banner.startswith("FAIL")
    errors = sum(not c["passed"] and c["severity"] == "error" for c in summary["checks"])
    warnings = sum(not c["passed"] and c["severity"] == "warn" for c in summary["checks"])
    assert f"{errors} error check" in banner and f"{warnings} warning" in banner
    assert "exits with 1" in banner

    first_table = _y(page, "table")
    assert _y(page, "#status") < _y(page, "#failing") == first_table
    assert first_table < _y(page, "#figures") < _y(page, "#latency")

    rows = page.execute_script(
        "return [...document.querySelectorAll('#failing tr')].slice(1)"
        ".map(r => [...r.cells].map(c => c.textContent.trim()))"
    )
    severities = [r[0] for r in rows]
    assert severities == sorted(severities, key=lambda s: s != "error")
    assert severities[0] == "error"
    failed = {c["name"]: c for c in summary["checks"] if not c["passed"]}
    assert {r[1] for r in rows} == set(failed)
    by_name = {r[1]: r for r in rows}
    assert by_name["verdicts_reproducible"][2:4] == ["2", "0"]
    assert "tables/discrepancies (2 rows)" in by_name["verdicts_reproducible"][5]
    assert by_name["verdicts_reproducible"][4] == failed["verdicts_reproducible"]["description"]
    assert DURATION.match(by_name["clock_skew"][2]), by_name["clock_skew"]
    assert by_name["clock_skew"][3] == "1.00 s"


def test_the_columns_of_each_failing_check_are_in_view(
    page: Any, audited_report: dict[str, Any]
) -> None:
    hidden = report_browser.failing_columns_out_of_view(page, audited_report["summary"]["checks"])
    assert {"verdicts_reproducible", "deadline_miss_rate", "clock_skew"} <= set(hidden)
    assert {name: columns for name, columns in hidden.items() if columns} == {}


def test_values_carry_separators_and_units(page: Any, audited_report: dict[str, Any]) -> None:
    summary = audited_report["summary"]
    acks = summary["totals"]["acks"]
    assert acks >= 1000
    cards = dict(
        zip(_texts(page, ".card .k"), _texts(page, ".card .v"), strict=True),
    )
    assert cards["acks"] == f"{acks:,}"
    assert DURATION.match(cards["pickup p99"]), cards

    # The latency table: every percentile is a duration with its unit.
    header = _texts(page, "#latency > .scroll > table tr:first-child th")
    first = dict(
        zip(header, _texts(page, "#latency > .scroll > table tr:nth-child(2) td"), strict=True)
    )
    assert first["level"] == "all"
    for name in ("pickup p50", "process p99", "relay p99"):
        assert DURATION.match(first[name]), (name, first[name])

    # Rates as percentages; instants in ISO 8601 UTC.
    column = _texts(page, "#destinations tr:first-child th").index("success rate") + 1
    rates = _texts(page, f"#destinations td:nth-child({column})")
    assert rates and all(re.fullmatch(r"\d+(\.\d+)? %|\u2013", r) for r in rates), rates
    instants = _texts(page, "td.time")
    assert instants and all(INSTANT.match(t) for t in instants), instants
    until = instant(summary["window"]["until"])
    assert f"CMs sent before {until}" in page.find_element("css selector", ".meta").text

    # No float printed raw: no exponents, no long fractions.
    text = page.find_element("css selector", "body").text
    assert not re.search(r"\b\d(\.\d+)?e[+-]\d\d\b", text)
    assert not re.search(r"\d\.\d{4,}", text)


def test_chart_axes_are_labelled_with_times_and_units(page: Any) -> None:
    over_time = "svg[aria-label^='CM outcomes'] text"
    labels = _texts(page, over_time)
    assert any(label.startswith("sent_at, UTC on 2025-01-01, buckets of ") for label in labels)
    times = [label for label in labels if re.fullmatch(r"\d\d:\d\d(:\d\d)?", label)]
    assert len(times) >= 3
    assert times == sorted(times)
    assert "CMs" in labels

    pickup = _texts(page, "svg[aria-label^='pickup latency'] text")
    assert "acks" in pickup
    assert any(re.fullmatch(r"<[\d.]+ (ms|s)", label) for label in pickup), pickup

    skew = _texts(page, "svg[aria-label^='proven receiver clock'] text")
    assert "rcv-qb" in skew
    assert any(DURATION.match(label) and label.startswith("-") for label in skew), skew


def test_the_report_is_self_contained(audited_report: dict[str, Any]) -> None:
    html = Path(audited_report["report"]).read_text()
    assert "<script" not in html
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", html)
