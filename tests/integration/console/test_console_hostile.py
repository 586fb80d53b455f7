"""Hostile input against every route of the console, on SQLite and PostgreSQL: NUL bytes,
huge numbers, bad and out-of-range dates, long names and forged Host headers in path
parameters, query parameters and forms. Nothing answers 5xx; a NUL byte anywhere is a 400;
the same routes with valid input still answer 200.

The routes come from the application itself and the parameter names from the console's
source, so a route or a parameter added later is attacked without editing this file.
"""

from __future__ import annotations

import http.client
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import pytest
import sqlalchemy as sa
from starlette.routing import Route

import condmsg.console.app as console_app
from tests.integration.console_world import TOKEN, UNDECODABLE_CM, seeded, serve

pytestmark = [pytest.mark.postgres]

NUL = "a\x00b"
HOSTILE = {
    "nul": NUL,
    "huge": "9" * 40,
    "negative": "-" + "9" * 30,
    "float": "1e999",
    "bad date": "2026-13-45T25:61",
    "year 1 west of UTC": "0001-01-01T00:00:00-05:00",
    "year 9999 east of UTC": "9999-12-31T23:59:59+05:00",
    "long name": "x" * 4000,
    "markup": "<script>alert(1)</script>",
    "path": "../../etc/passwd",
    "cursor": "2026-01-01T00:00:00|" + "\x00",
    "bad cursor": "not-a-date|id",
    "replacement": "\ufffd\uffff",
}


def _parameter_names() -> list[str]:
    """Every query or form parameter the console reads, found in its source."""
    source = Path(console_app.__file__).read_text()
    names = set(re.findall(r"""(?:params|form)\.get(?:_all)?\(\s*["'](\w+)["']""", source))
    names |= set(re.findall(r"""params\[["'](\w+)["']\]""", source))
    assert {"state", "since", "after", "id", "store"} <= names, names
    return sorted(names)


def _routes() -> list[tuple[str, str]]:
    """(method, path template) of every route of the app."""
    app = console_app.create_app(console_app.ConsoleConfig(stores=[_NoStore()], settings=None))  # type: ignore[arg-type, list-item]
    found = []
    for route in app.routes:
        assert isinstance(route, Route), route
        for method in sorted(route.methods or {"GET"}):
            if method != "HEAD":
                found.append((method, route.path))
    return found


class _NoStore:
    """Enough of a store for create_app to list its routes."""

    label = "none"
    engine = sa.create_engine("sqlite://")
    outbox = None


def _fill(path: str, value: str) -> str:
    return re.sub(r"\{(\w+)(?::\w+)?\}", lambda _: quote(value, safe=""), path)


@pytest.fixture(params=["sqlite", "postgresql"])
def base(request: pytest.FixtureRequest, amqp_url: str, tmp_path: Path) -> Iterator[str]:
    """The console (token set) over a seeded store (console_world.seed)."""
    pg = request.getfixturevalue("pg_engine_url") if request.param == "postgresql" else ""
    with seeded(request.param, pg, tmp_path) as url, serve(url, amqp_url, TOKEN) as served:
        yield served


def _connection(base: str) -> http.client.HTTPConnection:
    parts = urlsplit(base)
    return http.client.HTTPConnection(str(parts.hostname), parts.port, timeout=30)


def _request(
    base: str,
    method: str,
    target: str,
    body: str | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, str]:
    """One request as sent (no client-side quoting or checks), and its status and body."""
    conn = _connection(base)
    try:
        sent = dict(headers or {})
        if body is not None:
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        conn.request(method, target, body=body, headers=sent)
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        conn.close()


def _session(base: str) -> dict[str, str]:
    """A logged-in session's cookie and its CSRF token, to reach the actions' checks."""
    conn = _connection(base)
    conn.request(
        "POST",
        "/login",
        body=urlencode({"token": TOKEN}),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    response = conn.getresponse()
    response.read()
    cookie = str(response.getheader("set-cookie")).split(";", 1)[0]
    conn.request("GET", "/outbox", headers={"Cookie": cookie})
    page = conn.getresponse().read().decode()
    conn.close()
    csrf = re.search(r'name="csrf" value="([^"]*)"', page)
    return {"cookie": cookie, "csrf": csrf.group(1) if csrf else ""}


def _attacks(method: str, path: str, session: dict[str, str]) -> Iterator[tuple[str, Any]]:
    """(description, request arguments) of every hostile request on one route."""
    params = _parameter_names()
    headers = {"Cookie": session["cookie"]}
    for kind, value in HOSTILE.items():
        target = _fill(path, value)
        if method == "GET":
            yield f"path {kind}", (target, None, headers)
            for name in params:
                query = "?" + urlencode({name: value})
                yield f"{name}={kind}", (_fill(path, "x") + query, None, headers)
        else:
            form = dict.fromkeys(params, value) | {"csrf": session["csrf"]}
            yield f"path {kind}", (target, urlencode(form), headers)
            for name in params:
                fields = {name: value, "csrf": session["csrf"]}
                yield f"{name}={kind}", (_fill(path, "requeue"), urlencode(fields), headers)
    forged = headers | {"Host": "evil.example:80"}
    yield "forged Host", (_fill(path, "x"), None if method == "GET" else "", forged)


def test_every_route_answers_hostile_input_without_a_server_error(base: str) -> None:
    session = _session(base)
    failures = []
    requests = 0
    for method, path in _routes():
        for what, (target, body, headers) in _attacks(method, path, session):
            requests += 1
            status, text = _request(base, method, target, body, headers)
            # A NUL byte in a path or query is refused as such; in a form, the form's own
            # checks answer (a wrong token, a missing session: some 4xx or a redirect).
            nul_in_url = "%00" in target
            if status >= 500 or (nul_in_url and status != 400) or "Traceback" in text:
                failures.append(f"{method} {path} {what}: {status} {text[:200]!r}")
            if what == "forged Host" and not 400 <= status < 500:
                failures.append(f"{method} {path} forged Host: {status}")
    assert failures == [], f"{len(failures)} of {requests} requests:\n" + "\n".join(failures)


def test_valid_requests_still_answer(base: str) -> None:
    for target in ("/", "/live/overview", "/cms", "/cms?state=overdue", "/outbox", "/spheres"):
        assert _request(base, "GET", target)[0] == 200, target
    status, page = _request(base, "GET", f"/cms/{UNDECODABLE_CM}")
    assert status == 200
    assert "cannot be decoded" in page
    assert _request(base, "GET", f"/spheres/{uuid.uuid4()}")[0] == 404
