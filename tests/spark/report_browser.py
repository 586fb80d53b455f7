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
from collections.abc import Iterator
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
