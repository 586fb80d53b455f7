"""The console's safety against a real PostgreSQL and RabbitMQ: looking at dead letters takes
none of them, no URL it prints shows a password, it answers only its own Host names, a bind
it cannot protect is refused, failed logins are throttled, cookies can be Secure, and a purge
asks first (in Chromium)."""

from __future__ import annotations

import http.client
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.error import HTTPError
from urllib.parse import urlencode, urlsplit
from urllib.request import HTTPRedirectHandler, Request, build_opener, urlopen

import pika
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import outbox
from condmsg import tables
from condmsg.cli.console import ENV_TOKEN
from condmsg.console import auth
from condmsg.core import protocol
from condmsg.core.errors import ConfigError
from condmsg.core.timeutil import utcnow
from condmsg.runtime.migrate import upgrade
from evaluator.intake import dead_letter, dead_letter_anomaly
from outbox.enqueueing import enqueue_all
from outbox.message import OutboxMessage
from tests.conftest import RUN
from tests.integration import console_browser
from tests.integration.console_world import _free_port, in_schema, schema, serve
from tests.waiting import wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres, pytest.mark.xdist_group("console")]

TOKEN = "safety-token-" + "x" * 40
PASSWORD = "s3cret"
COMMAND = (sys.executable, "-m", "condmsg.cli")


@pytest.fixture(scope="module")
def store_url(pg_engine_url: str) -> Iterator[str]:
    """A migrated, empty sender store (trust authentication: its URL's password is only
    there to be masked)."""
    with schema(pg_engine_url) as name:
        url = in_schema(pg_engine_url, name)
        engine = sa.create_engine(url)
        upgrade(engine, "sender")
        engine.dispose()
        yield f"{url}&password={PASSWORD}"


def _get(url: str, host: str | None = None) -> tuple[int, str, dict[str, str]]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        conn.putrequest("GET", parts.path + (f"?{parts.query}" if parts.query else ""), True)
        conn.putheader("Host", host if host is not None else parts.netloc)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.read().decode(), dict(response.getheaders())
    finally:
        conn.close()


class _NoRedirect(HTTPRedirectHandler):
    def redirect_request(self, *args: Any) -> None:
        return None


def _login(base: str, token: str) -> tuple[int, dict[str, str]]:
    request = Request(base + "/login", data=urlencode({"token": token}).encode(), method="POST")
    try:
        with build_opener(_NoRedirect).open(request) as response:
            return int(response.status), dict(response.headers)
    except HTTPError as exc:
        return exc.code, dict(exc.headers)


# -- dead letters ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments",
    [{"x-queue-type": "quorum", "x-delivery-limit": 3}, {"x-queue-type": "classic"}],
    ids=["quorum-delivery-limit-3", "classic"],
)
def test_a_hundred_views_take_no_dead_letter(
    store_url: str, amqp_url: str, arguments: dict[str, Any]
) -> None:
    sender = f"t-console-dead-{RUN}-{uuid.uuid4().hex[:6]}"
    queue = protocol.dead_letter_queue(sender)
    bodies = [b"{not json", b"<b>not an ack</b>"]
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = connection.channel()
    channel.queue_declare(queue, durable=True, arguments=arguments)
    channel.confirm_delivery()
    engine = sa.create_engine(store_url)
    try:
        # What the evaluator does with a body it cannot decode: the dead letter and its
        # record in the store (same transaction there; published here by hand).
        with Session(engine) as session, session.begin():
            for body in bodies:
                message = dead_letter(body, sender, "not JSON")
                session.execute(
                    sa.insert(tables.anomalies), [dead_letter_anomaly(message, utcnow())]
                )
                channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
        with serve(store_url, amqp_url, None, sender=sender) as base:
            for _ in range(100):
                status, page, _headers = _get(base + "/outbox")
                assert status == 200
            assert f"{queue}</code>: 2 messages in the queue now" in page
            assert "not JSON; body (17 bytes): &lt;b&gt;not an ack&lt;/b&gt;" in page
        taken: list[bytes] = []
        for _ in bodies:
            method, props, got = channel.basic_get(queue, auto_ack=True)
            assert method is not None and props is not None, f"a dead letter is gone: {taken}"
            taken.append(got or b"")
            # Never delivered before: no view spent one of its delivery attempts.
            assert not method.redelivered
            assert not (props.headers or {}).get("x-delivery-count")
        assert taken == bodies
        assert channel.queue_declare(queue, passive=True).method.message_count == 0
    finally:
        channel.queue_delete(queue)
        connection.close()
        with engine.begin() as conn:
            conn.execute(sa.delete(tables.anomalies))
        engine.dispose()


# -- credentials -----------------------------------------------------------------------


def test_no_page_and_no_log_line_shows_a_password_of_the_store_url(
    store_url: str, amqp_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with serve(store_url, amqp_url, TOKEN, sender="t-console-nobody") as base:
        for path in ("/", "/cms", "/cms/no-such-cm", "/spheres/none", "/outbox", "/login"):
            _status, page, _headers = _get(base + path)
            assert "condmsg console" in page, path
            assert PASSWORD not in page, path
            assert "password=***" in page, path
        _login(base, "wrong")
    assert PASSWORD not in caplog.text
    # The start-up log of `condmsg console` (a process of its own, as operators run it).
    port = _free_port()
    process = subprocess.Popen(
        [*COMMAND, "console", "--db-url", store_url, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, ENV_TOKEN: TOKEN},
    )
    try:
        wait_for(lambda: _answers(f"http://127.0.0.1:{port}/"), timeout=20)
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=10)
    assert "condmsg console on http://127.0.0.1" in output
    assert "password=***" in output
    assert PASSWORD not in output


def _answers(url: str) -> bool:
    try:
        with urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


# -- Host header -----------------------------------------------------------------------


def test_only_its_own_host_names_are_answered(store_url: str, amqp_url: str) -> None:
    with serve(
        store_url, amqp_url, None, allowed_hosts={"127.0.0.1", "localhost", "::1", "console.test"}
    ) as base:
        port = urlsplit(base).port
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "console.test"):
            assert _get(base + "/", host)[0] == 200, host
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.2", "", "localhost.evil"):
            status, body, headers = _get(base + "/cms", host)
            assert status == 400, host
            assert body.count("\n") == 1 and "--allowed-host" in body
            assert headers["content-type"].startswith("text/plain")


# -- binding and tokens (the command refuses before it opens anything) -------------------


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (["--host", "0.0.0.0"], "--insecure"),
        (["--host", "192.0.2.1"], "needs a token"),
        (["--token", "short-token"], "condmsg secret new"),
        (["--host", "0.0.0.0", "--insecure"], "--allowed-host NAME"),
    ],
)
def test_an_unsafe_start_is_refused_in_one_line(arguments: list[str], said: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONDMSG_CONSOLE")}
    done = subprocess.run(
        [*COMMAND, "console", "--db-url", "sqlite:///nowhere.db", *arguments],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert said in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not os.path.exists("nowhere.db")


# -- login ---------------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_failed_logins_are_throttled_per_client(store_url: str, amqp_url: str) -> None:
    clock = _Clock()
    with serve(store_url, amqp_url, TOKEN, monotonic=clock) as base:
        for _ in range(auth.MAX_FAILURES):
            assert _login(base, "guess")[0] == 403
        status, headers = _login(base, TOKEN)  # even the right token is not looked at now
        assert status == 429
        assert int(headers["retry-after"]) == auth.LOCKOUT_S
        clock.now += auth.LOCKOUT_S - 1
        assert _login(base, TOKEN)[0] == 429
        clock.now += 1
        assert _login(base, TOKEN)[0] == 303
        # A success forgets the failures; failures far apart never add up to a lockout.
        for _ in range(2 * auth.MAX_FAILURES):
            assert _login(base, "guess")[0] == 403
            clock.now += auth.FAILURE_WINDOW_S / (auth.MAX_FAILURES - 1) + 1


def test_cookies_are_secure_when_asked(store_url: str, amqp_url: str) -> None:
    with serve(store_url, amqp_url, TOKEN) as base:
        status, headers = _login(base, TOKEN)
        assert status == 303 and "secure" not in headers["set-cookie"].lower()
    with serve(store_url, amqp_url, TOKEN, secure_cookies=True) as base:
        status, headers = _login(base, TOKEN)
        assert status == 303
        assert "; secure" in headers["set-cookie"].lower()


def test_pages_need_the_login_when_asked(store_url: str, amqp_url: str) -> None:
    """``login_to_read`` (the CLI's default off loopback): no page, live fragment included,
    shows anything before the login; after it every page does."""
    with serve(store_url, amqp_url, TOKEN, login_to_read=True) as base:
        for path in ("/", "/cms", "/spheres", "/outbox"):
            status, body, headers = _get(base + path)
            assert (status, headers["location"]) == (303, "/login"), path
            assert body == ""  # nothing of the page
        assert _get(base + "/live/overview")[0] == 401
        status, headers = _login(base, TOKEN)
        assert (status, headers["location"]) == (303, "/")
        cookie = headers["set-cookie"].split(";")[0]
        with urlopen(Request(base + "/cms", headers={"Cookie": cookie}), timeout=10) as page:
            assert page.status == 200
    with serve(store_url, amqp_url, TOKEN) as base:
        assert _get(base + "/cms")[0] == 200  # on loopback without it: read-only, open
    from condmsg.console import ConsoleConfig, create_app
    from condmsg.runtime.settings import Settings

    with pytest.raises(ConfigError, match="needs a token"):
        create_app(ConsoleConfig(stores=[], settings=Settings(), login_to_read=True))


# -- purge ---------------------------------------------------------------------------------


def _park(engine: sa.Engine, count: int) -> list[int]:
    """``count`` outbox rows parked as the relay parks them (state ``failed``)."""
    table = outbox.outbox_table()
    with Session(engine) as session, session.begin():
        enqueue_all(
            session,
            [OutboxMessage(exchange="t.nowhere", routing_key="k", body=b"x")] * count,
        )
    with engine.begin() as conn:
        conn.execute(
            sa.update(table)
            .where(table.c.state == "pending")
            .values(state="failed", last_error="NOT_FOUND - no exchange", failed_at=utcnow())
        )
        return list(conn.scalars(sa.select(table.c.id).where(table.c.state == "failed")))


def test_a_purge_asks_first_in_the_browser(store_url: str, amqp_url: str) -> None:
    if not console_browser.available():
        pytest.fail("Chromium is not installed: `apt-get install chromium chromium-driver`")
    engine = sa.create_engine(store_url)
    table = outbox.outbox_table()

    def parked() -> set[int]:
        with engine.connect() as conn:
            return set(conn.scalars(sa.select(table.c.id).where(table.c.state == "failed")))

    try:
        first, second = _park(engine, 2)
        with serve(store_url, amqp_url, TOKEN) as base, console_browser.browser() as driver:
            driver.get(base + "/login")
            driver.find_element("id", "token").send_keys(TOKEN)
            driver.find_element("id", "login-button").click()
            wait_for(lambda: driver.find_elements("id", "purge"), timeout=10)
            driver.find_element("css selector", f"input[name=id][value='{first}']").click()
            driver.find_element("id", "purge").click()
            wait_for(lambda: driver.find_elements("id", "purge-what"), timeout=10)
            assert f"ids {first}" in driver.find_element("id", "purge-what").text
            assert parked() == {first, second}  # asked, nothing purged
            driver.find_element("id", "cancel-purge").click()
            wait_for(lambda: driver.find_elements("id", "purge"), timeout=10)
            assert parked() == {first, second}
            driver.find_element("css selector", f"input[name=id][value='{first}']").click()
            driver.find_element("id", "purge").click()
            wait_for(lambda: driver.find_elements("id", "confirm-purge"), timeout=10)
            driver.find_element("id", "confirm-purge").click()
            wait_for(lambda: driver.find_elements("id", "done"), timeout=10)
            assert "purged 1 row" in driver.find_element("id", "done").text
            assert parked() == {second}
            assert console_browser.console_errors(driver) == []
    finally:
        with engine.begin() as conn:
            conn.execute(sa.delete(table))
        engine.dispose()
