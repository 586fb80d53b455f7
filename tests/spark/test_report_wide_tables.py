"""A report whose tables are wider than a 1280 px window, opened in headless Chromium: the
columns each failing check is about are in view without scrolling sideways. The report is
rendered from inputs made by hand (no Spark), with names as long as a deployment's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from spark_audit.report import render
from tests.spark import report_browser
from tests.spark.report_inputs import CHECKS, summary, wide_collected

#: Every check of the inputs fails; the discrepancy check is the one error.
FAILING = summary(CHECKS)


@pytest.fixture(scope="module")
def wide_page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    report = tmp_path_factory.mktemp("wide") / "report.html"
    report.write_text(render(FAILING, wide_collected()))
    with report_browser.opened(report) as driver:
        yield driver


def _overflows(driver: Any, section: str) -> bool:
    return bool(
        driver.execute_script(
            "const box = document.querySelector(`#${arguments[0]} .scroll`);"
            "return box.querySelector('table').scrollWidth > box.clientWidth",
            section,
        )
    )


def test_the_tables_are_wider_than_the_window(wide_page: Any) -> None:
    for section in ("destinations", "discrepancies"):
        assert _overflows(wide_page, section), section
    width, scroll = wide_page.execute_script(
        "return [window.innerWidth, document.documentElement.scrollWidth]"
    )
    assert scroll <= width == report_browser.WIDTH


def test_the_columns_of_each_failing_check_are_in_view(wide_page: Any) -> None:
    hidden = report_browser.failing_columns_out_of_view(wide_page, FAILING["checks"])
    assert set(hidden) == set(CHECKS)
    assert {name: columns for name, columns in hidden.items() if columns} == {}


def test_the_failing_checks_fit_the_window(wide_page: Any) -> None:
    fits = wide_page.execute_script(
        "const box = document.querySelector('#failing').parentElement;"
        "return box.scrollWidth <= box.clientWidth"
    )
    assert fits
