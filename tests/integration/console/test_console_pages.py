"""The console's pages agree with each other and fit a narrow screen, in headless Chromium,
over a store seeded as if its evaluator had stopped an hour ago (console_world.seed): one
CM overdue, one whose condition cannot be decoded, an open sphere, names of 255 characters.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration import console_browser
from tests.integration.console_world import (
    LONG_DESTINATION,
    OVERDUE_CM,
    SEEDED_SPHERE,
    UNDECODABLE_CM,
    seeded,
    serve,
)

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.xdist_group("console")]


@pytest.fixture(scope="module")
def base(
    pg_engine_url: str, amqp_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("console-pages")
    with seeded("postgresql", pg_engine_url, directory) as url, serve(url, amqp_url, None) as b:
        yield b


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    if not console_browser.available():
        pytest.fail("Chromium is not installed: `apt-get install chromium chromium-driver`")
    with console_browser.browser() as d:
        yield d


@pytest.fixture
def browser(driver: Any) -> Iterator[Any]:
    """The module's browser; the test fails on any error or warning in its console."""
    console_browser.console_errors(driver)
    yield driver
    assert console_browser.console_errors(driver) == []


def _text(driver: Any, selector: str) -> str | None:
    return driver.execute_script(  # type: ignore[no-any-return]
        "const e = document.querySelector(arguments[0]); return e ? e.innerText : null",
        selector,
    )


def _listed(driver: Any) -> list[str]:
    return driver.execute_script(  # type: ignore[no-any-return]
        "return [...document.querySelectorAll('#cms td:first-child a')].map(a => a.innerText)"
    )


def test_every_page_agrees_on_which_cms_are_overdue(base: str, browser: Any) -> None:
    browser.get(base + "/")
    assert _text(browser, "#overdue") == "1"
    browser.get(base + "/cms?state=overdue")
    assert _listed(browser) == [OVERDUE_CM]
    assert _text(browser, "#matching") == "1 CM matches (newest first)."
    browser.get(base + "/cms")
    marked = browser.execute_script(
        "return [...document.querySelectorAll('#cms tr')]"
        ".filter(tr => tr.innerText.includes('overdue'))"
        ".map(tr => tr.querySelector('td a').innerText)"
    )
    assert marked == [OVERDUE_CM]
    assert _text(browser, "#matching") == "2 CMs match (newest first)."
    browser.get(base + f"/cms/{OVERDUE_CM}")
    assert _text(browser, "#overdue") == "overdue"
    browser.get(base + f"/cms/{UNDECODABLE_CM}")
    assert _text(browser, "#overdue") is None


def test_a_pending_cm_s_pill_and_verdict_agree(base: str, browser: Any) -> None:
    # Its deadline passed without an ack: the evaluator, once it sweeps, records violated.
    browser.get(base + f"/cms/{OVERDUE_CM}")
    assert _text(browser, "#state") == _text(browser, "#verdict") == "pending, would be violated"
    reasons = _text(browser, "#reasons") or ""
    assert "pickup" in reasons
    # One whose condition cannot be decoded says so and shows no verdict at all.
    browser.get(base + f"/cms/{UNDECODABLE_CM}")
    assert _text(browser, "#state") == "pending"
    assert _text(browser, "#verdict") is None
    assert "cannot be decoded" in (_text(browser, "#undecodable") or "")


def test_the_spheres_list_is_linked_from_every_page(base: str, browser: Any) -> None:
    browser.get(base + "/cms")
    browser.find_element("css selector", "header a[href='/spheres']").click()
    assert _text(browser, "h1") == "Dependency-Spheres"
    rows = _text(browser, "#spheres") or ""
    assert SEEDED_SPHERE in rows and "open" in rows
    assert "open 1" in (_text(browser, "#sphere-states") or "")
    browser.get(base + "/spheres?state=satisfied")
    assert "No sphere satisfied." in (_text(browser, "#spheres") or "")
    browser.get(base + "/spheres")
    browser.find_element("link text", SEEDED_SPHERE).click()
    assert SEEDED_SPHERE in (_text(browser, "h1") or "")


@pytest.mark.parametrize("width", [360, 768])
def test_long_names_wrap_at_a_narrow_width(base: str, browser: Any, width: int) -> None:
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": 800, "deviceScaleFactor": 1, "mobile": False},
    )
    try:
        for path in (
            "/",
            "/cms",
            f"/cms/{OVERDUE_CM}",
            f"/cms/{UNDECODABLE_CM}",
            "/spheres",
            f"/spheres/{SEEDED_SPHERE}",
            "/outbox",
        ):
            browser.get(base + path)
            page, view = browser.execute_script(
                "return [document.documentElement.scrollWidth, window.innerWidth]"
            )
            assert page <= view, (path, page, view)
        browser.get(base + f"/cms/{OVERDUE_CM}")
        assert LONG_DESTINATION in (_text(browser, "#copies") or "")
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
