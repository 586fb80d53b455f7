"""The console when its database goes away: a proxy in front of PostgreSQL turns into a
black hole (it accepts and never answers). Every page answers 503 with what is wrong within
the console's timeout plus a margin, naming the database with its password masked; the
overview keeps its figures under a visible stale mark; both recover once the database
answers again."""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Iterator
from typing import Any
from urllib.error import HTTPError
from urllib.request import urlopen

import pytest
import sqlalchemy as sa

from condmsg.runtime.migrate import upgrade
from tests.integration import console_browser
from tests.integration.console_world import in_schema, schema, serve
from tests.integration.tcp_proxy import TcpProxy
from tests.waiting import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

#: The console's database timeout in these tests (PostgreSQL's connect_timeout is 2 s at
#: least), and what a page may take beyond it: the deadline's second and slack for a busy
#: machine.
TIMEOUT_S = 2.0
MARGIN_S = 2.5
PASSWORD = "console-outage-pw"


@pytest.fixture
def outage(pg_engine_url: str, amqp_url: str) -> Iterator[tuple[TcpProxy, str]]:
    """A migrated sender store reached through a proxy, and the console over it."""
    with schema(pg_engine_url) as name:
        direct = in_schema(pg_engine_url, name)
        engine = sa.create_engine(direct)
        upgrade(engine, "sender")
        engine.dispose()
        proxy = TcpProxy.to(direct)
        proxy.up()
        # Trust authentication ignores the password; it is there to be masked.
        url = sa.make_url(proxy.url(direct)).set(password=PASSWORD).render_as_string(False)
        try:
            with serve(url, amqp_url, None, db_timeout_s=TIMEOUT_S) as base:
                yield proxy, base
        finally:
            proxy.close()


def _get(url: str) -> tuple[int, str, float]:
    started = time.monotonic()
    try:
        with urlopen(url, timeout=30) as response:
            status, body = int(response.status), response.read().decode()
    except HTTPError as exc:
        status, body = exc.code, exc.read().decode()
    return status, body, time.monotonic() - started


def test_a_black_holed_database_gives_a_503_within_the_timeout(
    outage: tuple[TcpProxy, str],
) -> None:
    proxy, base = outage
    assert _get(base + "/cms")[0] == 200  # a pooled connection, about to go silent
    proxy.hold()
    # The pooled connection (cut by the page's deadline), then new ones (connect timeout).
    for path in ("/cms", "/cms/some-id", "/", "/live/overview", "/spheres/s", "/outbox"):
        status, body, took = _get(base + path)
        assert status == 503, (path, body)
        assert took < TIMEOUT_S + MARGIN_S, (path, took)
        assert PASSWORD not in body and "***" in body, body
    status, body, _ = _get(base + "/cms")
    assert "The database is not answering" in body
    # No page is left blocked in the driver on the silent connection (it was shut down).
    wait_for(lambda: _threads_in_the_driver() == 0, timeout=TIMEOUT_S + MARGIN_S)
    proxy.release()
    wait_for(lambda: _get(base + "/cms")[0] == 200, timeout=10, what="the console recovers")


def _threads_in_the_driver() -> int:
    """Threads of this process (the console's workers among them) inside psycopg."""
    return sum(
        any("/psycopg/" in f.f_code.co_filename for f, _ in traceback.walk_stack(frame))
        for frame in sys._current_frames().values()
    )


def _shown(driver: Any, element_id: str) -> str | None:
    return driver.execute_script(  # type: ignore[no-any-return]
        "const e = document.getElementById(arguments[0]);"
        "return e && !e.hidden && e.offsetParent !== null ? e.innerText : null",
        element_id,
    )


def test_the_overview_marks_its_figures_stale_and_pages_say_why(
    outage: tuple[TcpProxy, str],
) -> None:
    proxy, base = outage
    if not console_browser.available():
        pytest.fail("Chromium is not installed: `apt-get install chromium chromium-driver`")
    with console_browser.browser() as driver:
        driver.get(base + "/")
        assert _shown(driver, "pending") == "0"
        assert _shown(driver, "stale") is None
        as_of = driver.execute_script(
            "return document.querySelector('#live [data-at]').getAttribute('data-at')"
        )
        proxy.hold()
        stale = str(wait_for(lambda: _shown(driver, "stale"), timeout=15, what="the stale mark"))
        assert stale.startswith("Stale since ")
        # The figures are kept, greyed, and the mark says since when and why.
        assert _shown(driver, "pending") == "0"
        assert "stale" in driver.find_element("id", "live").get_attribute("class")
        shown_as_of = stale.removeprefix("Stale since ").split(" ", 1)[0]
        assert shown_as_of >= as_of
        assert "no answer" in stale or "timeout" in stale, stale
        assert "***" in stale and PASSWORD not in stale
        # Another page: the styled error page, in one line.
        driver.get(base + "/cms")
        assert _shown(driver, "problem")
        assert "***" in (_shown(driver, "database") or "")
        assert driver.find_element("tag name", "h1").text == "The database is not answering"
        proxy.release()
        driver.get(base + "/")
        wait_for(lambda: _shown(driver, "pending") == "0", timeout=10, what="the overview")
        assert _shown(driver, "stale") is None
