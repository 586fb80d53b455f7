"""Open ``report.html`` in Debian's headless Chromium (through chromedriver), as a reader
at 1280 px would see it; and save a screenshot of one.

``python -m tests.spark.report_browser REPORT.html OUT.png [--height PX]`` writes the
screenshot docs/audit.md shows (see its *Reading the report*).

The flags keep Chromium off the network (no component updates, no sync, no QUIC, no
background requests): here it has none, and each failed lookup would slow it down.
"""

from __future__ import annotations

import argparse
import base64
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: The page width the report is held to (a laptop's browser window).
WIDTH = 1280
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)


def available() -> bool:
    """Chromium and its driver are installed (Debian's ``chromium``, ``chromium-driver``)."""
    return Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()


@contextmanager
def browser(height: int = 2000) -> Iterator[Any]:
    """A headless Chromium window ``WIDTH`` px wide, with a profile of its own that is
    removed afterwards."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="condmsg-chromium-")
    options = webdriver.ChromeOptions()
    # Both paths given: Selenium then never runs its manager, which would go online.
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={WIDTH},{height}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@contextmanager
def opened(report: Path, height: int = 2000) -> Iterator[Any]:
    """``report`` open in :func:`browser`; a test fails where Chromium is not installed."""
    if not available():
        import pytest

        pytest.fail(
            "Chromium is not installed: `apt-get install chromium chromium-driver` "
            "(`make test` installs them)"
        )
    with browser(height) as driver:
        driver.get(report.resolve().as_uri())
        yield driver


def screenshot(driver: Any, out: Path, height: int, top: int = 0) -> None:
    """``height`` px of the open page from ``top`` down, ``WIDTH`` px wide, as PNG."""
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": top, "width": WIDTH, "height": height, "scale": 1},
        },
    )
    out.write_bytes(base64.b64decode(shot["data"]))


def columns_out_of_view(driver: Any, section: str, headings: Iterable[str]) -> list[str]:
    """The ``headings`` that no table of the page's ``section`` shows without scrolling it
    sideways: missing, or past the right edge of the table's scrolling box."""
    in_view = driver.execute_script(
        "return [...document.querySelectorAll(`#${arguments[0]} .scroll`)].flatMap(box => {"
        "  const edge = box.getBoundingClientRect().left + box.clientWidth;"
        "  return [...box.querySelector('table').rows[0].cells]"
        "    .filter(c => c.getBoundingClientRect().right <= edge + 0.5)"
        "    .map(c => c.textContent.trim());"
        "})",
        section,
    )
    return [h for h in headings if h not in in_view]


def failing_columns_out_of_view(
    driver: Any, checks: Iterable[Mapping[str, Any]]
) -> dict[str, list[str]]:
    """For each failing check with rows in a section of the page, the columns it is about
    that the section's tables hide behind their scrollbar (none is the goal)."""
    from spark_audit.report_checks import EVIDENCE_COLUMNS, EVIDENCE_SECTIONS
    from spark_audit.report_values import heading

    hidden = {}
    for check in checks:
        section = EVIDENCE_SECTIONS.get(check["metric"])
        if check["passed"] or section is None:
            continue
        headings = [heading(c) for c in EVIDENCE_COLUMNS[check["metric"]]]
        hidden[check["name"]] = columns_out_of_view(driver, section, headings)
    return hidden


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="a report.html")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--height", type=int, default=1400, help="pixels from the top")
    parser.add_argument("--top", type=int, default=0, help="start this many pixels down")
    args = parser.parse_args(argv)
    with browser() as driver:
        driver.get(args.report.resolve().as_uri())
        screenshot(driver, args.out, args.height, args.top)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
