"""The console as a person sees it: headless Chromium opens each page against a store
filled by real sends (a Sender, an in-process Evaluator and its relay, a Receiver), reads
what is drawn, acts, and fails on any error in the browser's console log."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.error import HTTPError
from urllib.parse import urlencode
from urllib.request import HTTPRedirectHandler, Request, build_opener, urlopen

import pika
import pytest
import sqlalchemy as sa

from condmsg import Destination
from condmsg.core.timeutil import iso, stored_instant
from tests.conftest import RUN
from tests.integration import console_browser
from tests.integration.console_world import TOKEN, ConsoleWorld, console_world, serve
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.rabbitmq,
    pytest.mark.postgres,
    pytest.mark.slow,
    # One world and one browser for the module: its tests run on one worker.
    pytest.mark.xdist_group("console"),
]


@pytest.fixture(scope="module")
def world(pg_engine_url: str, amqp_url: str) -> Iterator[ConsoleWorld]:
    with console_world(pg_engine_url, amqp_url, f"t.console.{RUN}x{uuid.uuid4().hex[:6]}") as w:
        yield w


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    if not console_browser.available():
        pytest.fail(
            "Chromium is not installed: `apt-get install chromium chromium-driver` "
            "(`make test` installs them)"
        )
    with console_browser.browser() as d:
        yield d


@pytest.fixture
def browser(driver: Any) -> Iterator[Any]:
    """The module's browser; the test fails on any error or warning in its console."""
    console_browser.console_errors(driver)  # what earlier tests left
    yield driver
    assert console_browser.console_errors(driver) == []


def _text(driver: Any, selector: str) -> str:
    return str(
        driver.execute_script(
            "const e = document.querySelector(arguments[0]); return e ? e.innerText : null",
            selector,
        )
    )


def _cm_row(world: ConsoleWorld, cm_id: str) -> Any:
    from condmsg import tables

    with world.sender.engine.connect() as conn:
        cms = tables.cms
        return conn.execute(sa.select(cms).where(cms.c.cm_id == cm_id)).one()


def test_the_overview_counts_and_charts_and_refreshes_live(
    world: ConsoleWorld, browser: Any
) -> None:
    browser.get(world.base + "/")
    assert _text(browser, "h1") == "Overview"
    assert _text(browser, "#parked") == str(len(world.parked_ids))
    assert _text(browser, "#contradicted") == "1"
    assert browser.execute_script("return document.querySelectorAll('#chart rect').length") >= 3
    contradicted = _text(browser, "#contradictions")
    assert world.cms["contradicted"] in contradicted
    pending = int(_text(browser, "#pending"))
    # A CM sent now shows up without a reload.
    world.sender.send(b"live", Destination(f"{world.name}.q1", pickup_within=timedelta(hours=1)))
    wait_for(lambda: _text(browser, "#pending") == str(pending + 1), timeout=10)


def test_the_list_filters_and_pages_by_keyset(world: ConsoleWorld, browser: Any) -> None:
    browser.get(world.base + "/cms?verdict=violated")
    listed = _text(browser, "#cms")
    assert world.cms["violated"] in listed and world.cms["contradicted"] in listed
    assert world.cms["satisfied"] not in listed and world.cms["pending"] not in listed
    browser.get(world.base + "/cms?" + urlencode({"destination": f"{world.name}.q1"}))
    assert world.cms["satisfied"] in _text(browser, "#cms")
    assert world.cms["violated"] not in _text(browser, "#cms")
    browser.get(world.base + "/cms?" + urlencode({"id": world.cms["pending"][:8]}))
    assert world.cms["pending"] in _text(browser, "#cms")
    # Pages of two CMs each: following "next page" walks every CM once, newest first.
    links = "return [...document.querySelectorAll('#cms td:first-child a')].map(a => a.innerText)"
    browser.get(world.base + "/cms")
    everything = browser.execute_script(links)
    assert len(everything) >= 6
    seen: list[str] = []
    url = world.base + "/cms?limit=2"
    while url:
        browser.get(url)
        page = browser.execute_script(links)
        assert 1 <= len(page) <= 2
        seen += page
        url = browser.execute_script(
            "const a = document.getElementById('next'); return a ? a.href : null"
        )
    assert seen == everything


def test_a_violated_cm_names_its_failing_deadline(world: ConsoleWorld, browser: Any) -> None:
    cm_id = world.cms["violated"]
    row = _cm_row(world, cm_id)
    deadline = iso(stored_instant(row.sent_at) + timedelta(seconds=1))
    browser.get(world.base + f"/cms/{cm_id}")
    assert _text(browser, "#state") == "violated"
    failed = browser.execute_script(
        "return [...document.querySelectorAll('#tree .c.failed')].map(e => e.innerText)"
    )
    assert failed == [f"✗ process by {deadline}"]
    node = _text(browser, "#tree li[data-path='root[0]']")
    assert f"{world.name}.q2" in node and "read ack by alice" in node
    reasons = _text(browser, "#reasons")
    # Which words the evaluator gives depends on whether the READ ack reached it before
    # the deadline passed (then "never processed") or not (then no commit ack by it).
    assert f"process by {deadline}" in reasons
    assert "never processed" in reasons or "no commit ack by the deadline" in reasons
    timeline = _text(browser, "#timeline")
    for event in ("sent: 2 copies", f"read by {world.name}.q2", "decided violated", "compensation"):
        assert event in timeline


def test_a_contradicted_decision_says_so(world: ConsoleWorld, browser: Any) -> None:
    browser.get(world.base + f"/cms/{world.cms['contradicted']}")
    assert "would be satisfied, not violated" in _text(browser, "#contradiction")


def test_names_and_payloads_render_as_text(world: ConsoleWorld, browser: Any) -> None:
    for path in (
        f"/cms/{world.cms['pending']}",
        "/cms?" + urlencode({"destination": world.xss_destination}),
        "/outbox",
    ):
        browser.get(world.base + path)
        assert browser.title != "pwned"
        assert world.xss_destination in browser.execute_script("return document.body.innerText")
        scripts = browser.execute_script(
            "return [...document.querySelectorAll('script')].map(s => s.textContent)"
        )
        assert not any("pwned" in s or "not an ack" in s for s in scripts)
    assert "<script>not an ack</script>" in _text(browser, "#dead")


def test_a_sphere_shows_its_members(world: ConsoleWorld, browser: Any) -> None:
    browser.get(world.base + f"/spheres/{world.sphere_id}")
    assert world.cms["member"] in _text(browser, "#members")
    assert "release_stock" in _text(browser, "#participants")


def test_a_parked_row_is_requeued_and_leaves_the_list(
    world: ConsoleWorld, browser: Any, amqp_url: str
) -> None:
    (row_id,) = world.parked_ids
    browser.get(world.base + "/outbox")
    assert f"{world.missing_exchange}/orders" in _text(browser, f"#parked tr[data-id='{row_id}']")
    assert "does not exist" in _text(browser, f"#parked tr[data-id='{row_id}']")
    browser.find_element("id", "login").click()
    browser.find_element("id", "token").send_keys(TOKEN)
    browser.find_element("id", "login-button").click()
    wait_for(lambda: browser.find_elements("id", "requeue"), timeout=10)
    # The cause mended: the exchange now exists (and routes to a queue of the sender's).
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = connection.channel()
    channel.exchange_declare(world.missing_exchange, "direct")
    channel.queue_bind(f"{world.name}.q3", world.missing_exchange, "orders")
    connection.close()
    browser.find_element("css selector", f"input[name=id][value='{row_id}']").click()
    browser.find_element("id", "requeue").click()
    wait_for(lambda: "requeued 1 row" in _text(browser, "#done"), timeout=10)
    assert browser.find_elements("css selector", f"#parked tr[data-id='{row_id}']") == []

    def published() -> bool:
        with world.sender.engine.connect() as conn:
            return (
                conn.scalar(sa.text(f"SELECT count(*) FROM condmsg_outbox WHERE id = {row_id}"))
                == 0
            )

    wait_for(published, timeout=15)
    browser.get(world.base + "/outbox")
    assert browser.find_elements("id", "no-parked")


def _post(url: str, fields: dict[str, str], cookie: str | None = None) -> int:
    request = Request(url, data=urlencode(fields).encode(), method="POST")
    if cookie:
        request.add_header("Cookie", cookie)
    try:
        with urlopen(request) as response:
            return int(response.status)
    except HTTPError as exc:
        return exc.code


def test_actions_need_the_token_and_the_csrf_token(world: ConsoleWorld) -> None:
    requeue = world.base + "/outbox/requeue"
    assert _post(requeue, {"all": "1"}) == 401
    assert _post(world.base + "/login", {"token": "not-it"}) == 403

    class NoRedirect(HTTPRedirectHandler):
        def redirect_request(self, *args: Any) -> None:
            return None

    with pytest.raises(HTTPError) as redirected:
        build_opener(NoRedirect).open(
            world.base + "/login", data=urlencode({"token": TOKEN}).encode()
        )
    assert redirected.value.code == 303
    set_cookie = redirected.value.headers["set-cookie"]
    assert "HttpOnly" in set_cookie and "SameSite=strict" in set_cookie
    cookie = set_cookie.split(";", 1)[0]
    assert _post(requeue, {"all": "1", "csrf": "forged"}, cookie) == 403
    assert _post(requeue, {"all": "1"}, cookie) == 403


def test_reading_works_through_a_select_only_role(
    world: ConsoleWorld, pg_engine_url: str, amqp_url: str
) -> None:
    role = f"console_ro_{uuid.uuid4().hex[:8]}"
    schema = sa.make_url(world.db_url).query["options"].split("=", 1)[1]
    admin = sa.create_engine(pg_engine_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE ROLE {role} LOGIN"))
        conn.execute(sa.text(f'GRANT USAGE ON SCHEMA "{schema}" TO {role}'))
        conn.execute(sa.text(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO {role}'))
    try:
        url = sa.make_url(world.db_url).set(username=role).render_as_string(False)
        with serve(url, amqp_url, token=None) as base:
            for path in (
                "/",
                "/cms",
                f"/cms/{world.cms['violated']}",
                f"/spheres/{world.sphere_id}",
                "/outbox",
            ):
                with urlopen(base + path) as response:
                    assert response.status == 200, path
                    body = response.read().decode()
                    assert "Actions are disabled" in body or path != "/outbox"
            assert _post(base + "/outbox/purge", {"all": "1"}) == 403
            with sa.create_engine(url).connect() as conn, pytest.raises(sa.exc.ProgrammingError):
                conn.execute(sa.text("DELETE FROM condmsg_outbox"))
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'REVOKE ALL ON ALL TABLES IN SCHEMA "{schema}" FROM {role}'))
            conn.execute(sa.text(f'REVOKE USAGE ON SCHEMA "{schema}" FROM {role}'))
            conn.execute(sa.text(f"DROP ROLE {role}"))
        admin.dispose()
