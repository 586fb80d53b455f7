"""The console's ASGI application: server-rendered pages over a sender store.

Pages only read (a role with SELECT on the store's tables is enough); the two actions,
requeueing and purging parked outbox rows, go through :class:`outbox.OutboxStore` as
``condmsg outbox requeue|purge`` does, behind :mod:`condmsg.console.auth`, and each is
logged. Jinja escapes every value it renders (autoescape on), so a destination or a
payload excerpt is always shown as text. Every response carries a Content-Security-Policy
that allows only the page's own inline style and its one nonce-tagged refresh script.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, unquote_to_bytes

import jinja2
import markupsafe
import sqlalchemy as sa
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from condmsg import tables
from condmsg.console import dead_letters, deadline, detail, queries
from condmsg.console.auth import COOKIE, LoginThrottle, Sessions
from condmsg.console.hosts import LOOPBACK_NAMES, AllowedHosts
from condmsg.console.render import FILTERS, chart
from condmsg.core import protocol
from condmsg.core.errors import ConfigError
from condmsg.core.store_values import SphereState
from condmsg.core.timeutil import stored_instant, utcnow
from condmsg.core.wording import first_line, plural
from condmsg.infra.urls import redact_url
from condmsg.runtime.db import describe_db_url
from condmsg.runtime.settings import Settings

log = logging.getLogger("condmsg.console")

#: Actions on parked rows (``POST /outbox/ACTION``).
ACTIONS = ("requeue", "purge")
#: Parked rows and dead letters the outbox page lists at once.
PARKED_PAGE = 100
DEAD_LETTERS_SHOWN = 50
#: Spheres the sphere list shows (the newest).
SPHERES_SHOWN = 100
SPHERE_STATES = tuple(s.value for s in SphereState)
WINDOWS = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7)}


@dataclass(slots=True)
class Store:
    """A store the console shows: the sender store first, then receiver stores."""

    label: str
    engine: sa.Engine
    outbox: sa.Table | None


@dataclass(slots=True)
class ConsoleConfig:
    stores: Sequence[Store]
    settings: Settings
    #: Whose dead-letter queue to look at; None: the sender of the store's latest CM.
    sender: str | None = None
    amqp_url: str | None = None
    token: str | None = None
    refresh_s: float = 5.0
    #: Seconds a page waits for a store before it answers 503 (see condmsg.console.deadline).
    db_timeout_s: float = deadline.DEFAULT_DB_TIMEOUT_S
    clock: Callable[[], datetime] = field(default=utcnow)
    #: The ``Host`` names answered (condmsg.console.hosts); others get 400.
    allowed_hosts: Collection[str] = LOOPBACK_NAMES
    #: Mark the session cookie ``Secure`` (the console is reached over TLS, via a proxy).
    secure_cookies: bool = False
    #: Pages too need the login, not only actions (needs ``token``): what a console shows
    #: (destinations, reasons, payload excerpts) is for its operators alone.
    login_to_read: bool = False
    #: Monotonic seconds, for sessions' lifetimes and the login throttle.
    monotonic: Callable[[], float] = field(default=time.monotonic)


def create_app(config: ConsoleConfig) -> Starlette:
    if config.login_to_read and not config.token:
        raise ConfigError("a console whose pages need the login needs a token to log in with")
    console = _Console(config)
    for store in config.stores:
        deadline.watch_engine(store.engine)
    read = console.read
    return Starlette(
        middleware=[
            # The Host check first: a request for a foreign name gets no other answer.
            Middleware(AllowedHosts, names=config.allowed_hosts),
            Middleware(_RejectNul),
        ],
        routes=[
            Route("/", read(console.overview)),
            Route("/live/overview", read(console.overview_live, live=True)),
            Route("/cms", read(console.cm_list)),
            Route("/cms/{cm_id}", read(console.cm_page)),
            Route("/spheres", read(console.sphere_list)),
            Route("/spheres/{sphere_id}", read(console.sphere_page)),
            Route("/outbox", read(console.outbox_page)),
            Route("/outbox/{action:str}", console.outbox_action, methods=["POST"]),
            Route("/login", console.login, methods=["GET", "POST"]),
            Route("/logout", console.logout, methods=["POST"]),
        ],
    )


class _Console:
    """The pages and actions of one console, over its stores."""

    def __init__(self, config: ConsoleConfig) -> None:
        self.config = config
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("condmsg.console", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.env.filters.update(FILTERS)
        self.sessions = Sessions(config.token, config.monotonic)
        self.throttle = LoginThrottle(config.monotonic)
        self.sender_store = config.stores[0]

    def page(self, request: Request, template: str, status: int = 200, **context: Any) -> Response:
        nonce = secrets.token_urlsafe(16)
        session_id = request.cookies.get(COOKIE)
        session = self.sessions.get(session_id)
        html = self.env.get_template(template).render(
            request=request,
            nonce=nonce,
            store=redact_url(describe_db_url(self.sender_store.engine.url)),
            actions_enabled=self.sessions.enabled,
            logged_in=session is not None,
            csrf=session.csrf if session else "",
            **context,
        )
        response = HTMLResponse(html, status_code=status)
        response.headers["Content-Security-Policy"] = (
            "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
            f"script-src 'nonce-{nonce}'; connect-src 'self'; form-action 'self'; "
            "frame-ancestors 'none'; base-uri 'none'"
        )
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        return response

    def read(
        self, handler: Callable[[Request], Response], live: bool = False
    ) -> Callable[[Request], Any]:
        """``handler`` as an endpoint that answers 503 with what is wrong, in one line,
        when a store fails or does not answer within the timeout; a live fragment's 503
        carries only that line (the overview shows it beside its stale figures)."""
        limit = self.config.db_timeout_s

        async def endpoint(request: Request) -> Response:
            if self.config.login_to_read and not self.logged_in(request):
                if live:
                    return PlainTextResponse("log in with the console's token first", 401)
                return RedirectResponse("/login", status_code=303)
            watch = deadline.Watch()
            work = asyncio.ensure_future(run_in_threadpool(watch.run, handler, request))
            try:
                # Past the timeout plus a second the server's own statement timeout should
                # have answered; if it did not, the server is unreachable.
                return await asyncio.wait_for(asyncio.shield(work), limit + 1)
            except TimeoutError:
                watch.cut_all()  # frees the worker thread blocked on the dead connection
                problem = f"no answer within {limit:g} s"
            except sa.exc.DBAPIError as exc:
                problem = first_line(exc)
            except sa.exc.TimeoutError:
                problem = "every connection of the pool is busy"
            engine = watch.engine or self.sender_store.engine
            return self.unavailable(request, engine, problem, live)

        return endpoint

    def logged_in(self, request: Request) -> bool:
        return self.sessions.get(request.cookies.get(COOKIE)) is not None

    def unavailable(
        self, request: Request, engine: sa.Engine, problem: str, live: bool
    ) -> Response:
        database = redact_url(engine.url.render_as_string(False))
        log.warning("console %s: database %s: %s", request.url.path, database, problem)
        if live:
            return PlainTextResponse(f"{database}: {problem}", status_code=503)
        return self.page(request, "unavailable.html", 503, database=database, problem=problem)

    def overview_data(self, request: Request) -> dict[str, Any]:
        window_name = request.query_params.get("window", "24h")
        window = WINDOWS.get(window_name, WINDOWS["24h"])
        with self.sender_store.engine.connect() as conn:
            view = queries.overview(conn, self.config.clock(), window, self.sender_store.outbox)
        return {"view": view, "chart": chart(view), "window": window_name, "windows": WINDOWS}

    def overview(self, request: Request) -> Response:
        return self.page(
            request, "overview.html", refresh_s=self.config.refresh_s, **self.overview_data(request)
        )

    def overview_live(self, request: Request) -> Response:
        return self.page(request, "overview_live.html", **self.overview_data(request))

    def cm_list(self, request: Request) -> Response:
        params = request.query_params
        problems: list[str] = []
        flt = queries.ListFilter(
            state=_choice(params.get("state"), queries.STATES),
            verdict=_choice(params.get("verdict"), queries.VERDICTS),
            destination=params.get("destination") or None,
            since=_instant(params.get("since"), "since", problems),
            until=_instant(params.get("until"), "until", problems),
            cm_id=(params.get("id") or "").strip() or None,
        )
        limit = min(max(_int(params.get("limit")) or queries.PAGE_SIZE, 1), 500)
        after = None
        if params.get("after"):
            try:
                after = queries.Cursor.decode(params["after"])
            except ValueError:
                problems.append("the page cursor is not one this console wrote; first page shown")
        with self.sender_store.engine.connect() as conn:
            found = queries.cm_page(conn, flt, after, self.config.clock(), limit)
        kept = {k: v for k, v in params.items() if k != "after" and v}
        return self.page(
            request,
            "cms.html",
            flt=flt,
            found=found,
            problems=problems,
            kept=kept,
            first_page=after is None,
            states=queries.STATES,
            verdicts=queries.VERDICTS,
        )

    def cm_page(self, request: Request) -> Response:
        cm_id = request.path_params["cm_id"]
        with self.sender_store.engine.connect() as conn:
            found = detail.cm_detail(
                conn, cm_id, self.config.settings, self.sender_store.outbox, self.config.clock()
            )
        if found is None:
            return self.page(request, "missing.html", 404, what="conditional message", ident=cm_id)
        return self.page(request, "cm.html", cm=found)

    def sphere_list(self, request: Request) -> Response:
        state = _choice(request.query_params.get("state"), SPHERE_STATES)
        with self.sender_store.engine.connect() as conn:
            found = detail.sphere_list(conn, state, SPHERES_SHOWN)
        return self.page(request, "spheres.html", found=found, state=state, states=SPHERE_STATES)

    def sphere_page(self, request: Request) -> Response:
        sphere_id = request.path_params["sphere_id"]
        with self.sender_store.engine.connect() as conn:
            found = detail.sphere_detail(conn, sphere_id)
        if found is None:
            return self.page(request, "missing.html", 404, what="sphere", ident=sphere_id)
        return self.page(request, "sphere.html", sphere=found)

    def outbox_page(self, request: Request) -> Response:
        index = _store_index(request.query_params.get("store"), self.config.stores)
        chosen = self.config.stores[index]
        after = _int(request.query_params.get("after"))
        rows: list[dict[str, Any]] = []
        if chosen.outbox is not None:
            with chosen.engine.connect() as conn:
                rows = detail.parked_rows(conn, chosen.outbox, after, PARKED_PAGE + 1)
        more = len(rows) > PARKED_PAGE
        rows = rows[:PARKED_PAGE]
        dead = None
        anomalies = []
        if index == 0:
            dead = self.dead_letters()
            with self.sender_store.engine.connect() as conn:
                anomalies = queries.recent_anomalies(conn, 50)
        return self.page(
            request,
            "outbox.html",
            stores=self.config.stores,
            index=index,
            chosen=chosen,
            rows=rows,
            next_after=rows[-1]["id"] if more and rows else None,
            dead=dead,
            anomalies=anomalies,
            done=_done(request.query_params.get("done")),
        )

    def dead_letters(self) -> dead_letters.DeadLetters | None:
        """The dead letters the store recorded, and the queue's depth if there is a broker
        to ask (nothing is taken from the queue: condmsg.console.dead_letters)."""
        sender = self.config.sender or _latest_sender(self.sender_store.engine)
        if sender is None:
            return None
        found = dead_letters.DeadLetters(protocol.dead_letter_queue(sender))
        with self.sender_store.engine.connect() as conn:
            found.recorded = dead_letters.recorded(conn, DEAD_LETTERS_SHOWN)
        if self.config.amqp_url:
            found.count, found.problem = dead_letters.depth(self.config.amqp_url, sender)
        return found

    async def login(self, request: Request) -> Response:
        if request.method == "GET":
            return self.page(request, "login.html", failed=False, wait_s=None)
        client = request.client.host if request.client else "?"
        wait = self.throttle.retry_after(client)
        if wait is not None:
            log.warning("console login from %s refused unchecked: too many failures", client)
            response = self.page(request, "login.html", 429, failed=False, wait_s=math.ceil(wait))
            response.headers["Retry-After"] = str(math.ceil(wait))
            return response
        form = await _form(request)
        session_id = self.sessions.login(form.get("token", ""))
        if session_id is None:
            self.throttle.failed(client)
            log.warning("console login refused from %s", client)
            return self.page(request, "login.html", 403, failed=True, wait_s=None)
        self.throttle.succeeded(client)
        log.info("console login from %s", client)
        response = RedirectResponse("/" if self.config.login_to_read else "/outbox", 303)
        response.set_cookie(
            COOKIE,
            session_id,
            httponly=True,
            samesite="strict",
            secure=self.config.secure_cookies,
            path="/",
        )
        return response

    async def logout(self, request: Request) -> Response:
        form = await _form(request)
        session_id = request.cookies.get(COOKIE)
        if self.sessions.check_csrf(session_id, form.get("csrf", "")):
            self.sessions.logout(session_id)
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    async def outbox_action(self, request: Request) -> Response:
        action = request.path_params["action"]
        if action not in ACTIONS:
            return _refused(f"no such action; one of: {', '.join(ACTIONS)}", 404)
        form = await _form(request)
        session_id = request.cookies.get(COOKIE)
        client = request.client.host if request.client else "?"
        if not self.sessions.enabled:
            return _refused("actions are disabled: start the console with --token")
        if self.sessions.get(session_id) is None:
            return _refused("log in with the console's token first", 401)
        if not self.sessions.check_csrf(session_id, form.get("csrf", "")):
            log.warning("console %s refused from %s: bad CSRF token", action, client)
            return _refused("the form's CSRF token does not match your session")
        index = _store_index(form.get("store", "0"), self.config.stores)
        chosen = self.config.stores[index]
        if chosen.outbox is None:
            return _refused("this store has no outbox table", 400)
        everything = form.get("all") == "1"
        ids = sorted({i for i in (_int(v) for v in form.get_all("id")) if i is not None})
        if not everything and not ids:
            return _refused("choose the rows (or all of them)", 400)
        if action == "purge" and form.get("confirm") != "yes":
            # Purging deletes for good: the button shows what it would delete, and only
            # the confirmation page's own form (confirm=yes) deletes.
            return self.page(
                request,
                "confirm_purge.html",
                index=index,
                chosen=chosen,
                everything=everything,
                ids=ids,
            )
        done = await run_in_threadpool(_act, chosen, action, None if everything else ids)
        log.info(
            "console %s of %s parked row(s) in %s (%s) from %s: %d done",
            action,
            "all" if everything else len(ids),
            chosen.label,
            "every row" if everything else "ids " + ",".join(map(str, ids)),
            client,
            done,
        )
        return RedirectResponse(f"/outbox?store={index}&done={action}+{done}", status_code=303)


class _Form:
    """An ``application/x-www-form-urlencoded`` body (the console's forms send nothing
    else, so no multipart parser is needed)."""

    def __init__(self, body: bytes) -> None:
        self._fields = parse_qs(body.decode("utf-8", "replace"), max_num_fields=1000)

    def get(self, name: str, default: str = "") -> str:
        return self._fields.get(name, [default])[0]

    def get_all(self, name: str) -> list[str]:
        return self._fields.get(name, [])


async def _form(request: Request) -> _Form:
    return _Form(await request.body())


def _act(store: Store, action: str, ids: list[int] | None) -> int:
    """The same calls as ``condmsg outbox requeue|purge``."""
    import outbox

    assert store.outbox is not None
    rows = outbox.OutboxStore(store.engine, table_name=store.outbox.name)
    if action == "requeue":
        return rows.requeue_failed(ids)
    if action == "purge":
        return rows.delete_failed(ids)
    raise ValueError(action)


def _refused(reason: str, status: int = 403) -> Response:
    return HTMLResponse(f"<p>{_escape(reason)}</p>", status_code=status)


def _escape(text: str) -> str:
    return str(markupsafe.escape(text))


def _choice(value: str | None, allowed: Sequence[str]) -> str | None:
    return value if value in allowed else None


def _int(value: str | None) -> int | None:
    """A 64-bit integer (what the stores' ids are), or None for anything else."""
    try:
        number = int(value) if value else None
    except ValueError:
        return None
    return number if number is None or -(2**63) <= number < 2**63 else None


def _done(value: str | None) -> str | None:
    """What the action that redirected here did (``done=purge+3``), in words."""
    action, _, count = (value or "").partition(" ")
    number = _int(count)
    if action not in ACTIONS or number is None:
        return None
    return f"{action}d {plural(number, 'row')}"  # requeued, purged


def _store_index(value: str | None, stores: Sequence[Store]) -> int:
    index = _int(value) or 0
    return index if 0 <= index < len(stores) else 0


def _instant(value: str | None, name: str, problems: list[str]) -> datetime | None:
    """An ISO 8601 instant from a form (``datetime-local`` gives one without a zone: UTC)."""
    if not value:
        return None
    try:
        return stored_instant(datetime.fromisoformat(value.strip()))
    except (ValueError, OverflowError):  # OverflowError: year 1 or 9999 once in UTC
        problems.append(f"{name}: not an ISO 8601 instant between the years 1 and 9999; ignored")
        return None


class _RejectNul:
    """Answers 400 to a request with a NUL byte in its path or query: no name, id or
    filter of the console holds one, PostgreSQL refuses it in text, and an error from the
    depths of a driver is no way to say so."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (
            "\x00" in scope["path"] or b"\x00" in unquote_to_bytes(scope["query_string"])
        ):
            response = PlainTextResponse("bad request: a NUL byte in the path or query", 400)
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _latest_sender(engine: sa.Engine) -> str | None:
    cms = tables.cms
    with engine.connect() as conn:
        found = conn.scalar(sa.select(cms.c.sender).order_by(cms.c.sent_at.desc()).limit(1))
    return None if found is None else str(found)
