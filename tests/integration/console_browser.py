"""Headless Chromium for the console's tests (Debian's chromium and chromium-driver, with
the flags tests/spark/report_browser.py explains), reading the browser's console log."""

from __future__ import annotations

import base64
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.spark.report_browser import CHROMEDRIVER, CHROMIUM, FLAGS, WIDTH, available

__all__ = ["available", "browser", "console_errors", "screenshot"]


@contextmanager
def browser(height: int = 1000) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="condmsg-console-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={WIDTH},{height}"):
        options.add_argument(flag)
    # Every console message (errors, CSP violations) is kept for driver.get_log("browser").
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def console_errors(driver: Any) -> list[str]:
    """The browser log's errors and warnings since the last call (it empties the log)."""
    return [
        str(entry["message"])
        for entry in driver.get_log("browser")
        if entry["level"] in ("SEVERE", "WARNING")
    ]


def screenshot(driver: Any, out: Path) -> None:
    """The whole page, ``WIDTH`` px wide, as PNG (at most 1,400 px tall)."""
    height = min(int(driver.execute_script("return document.body.scrollHeight")), 1400)
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": WIDTH, "height": height, "scale": 1},
        },
    )
    out.write_bytes(base64.b64decode(shot["data"]))
