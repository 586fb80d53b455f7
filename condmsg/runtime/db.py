"""Engines for the stores, SQLite and PostgreSQL alike.

SQLite is the embedded default. It allows one writer at a time, so its engine runs in WAL
mode (readers do not block the writer) with a busy timeout (a second writer waits instead
of failing at once), and opens each transaction with ``BEGIN IMMEDIATE`` so that a
read-then-write transaction takes the write lock up front instead of failing to upgrade it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.engine.url import make_url

from condmsg.core.errors import ConfigError, StoreError
from condmsg.infra.urls import redact_url

SQLITE_BUSY_TIMEOUT_MS = 30_000
#: A pooled PostgreSQL connection is pinged before it is handed out only if it sat in the
#: pool at least this long (seconds); see :func:`make_engine`.
PING_AFTER_IDLE_S = 1.0


def describe_db_url(url: str | sa.URL) -> str:
    """The URL without its credentials, for messages, logs and metrics labels: SQLAlchemy's
    ``hide_password`` masks the user info's password but keeps a query string's
    (``?password=``, ``sslpassword=``, which psycopg passes on to libpq), so the rendered URL
    goes through :func:`condmsg.infra.urls.redact_url` too."""
    try:
        return redact_url(make_url(url).render_as_string(hide_password=True))
    except Exception:
        return "<unparseable database URL>"


def require_existing_file(url: str) -> str:
    """``url``, or :class:`ConfigError` if it names a SQLite file that does not exist:
    SQLite creates a missing file on the first connection, so a mistyped path would become
    an empty store in whatever directory the command ran in. A store is created on
    purpose, by ``condmsg db upgrade`` (or ``--create-schema``), never by a reader."""
    parsed = make_url(url)
    path = parsed.database or ""
    a_file = path not in ("", ":memory:") and not path.startswith("file:")  # file: is a URI
    if parsed.get_backend_name() == "sqlite" and a_file and not Path(path).exists():
        raise ConfigError(
            f"no store at {path} (a SQLite file that does not exist); check the path, "
            "or create the store with: condmsg db upgrade --db-url ..."
        )
    return url


def configure_sqlite(engine: Engine) -> None:
    """Give a SQLite engine condmsg's connection settings (WAL, the busy timeout) and
    ``BEGIN IMMEDIATE`` transactions; an async engine's ``sync_engine`` takes them too."""

    @sa.event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
        # Take transaction control from the driver so BEGIN IMMEDIATE below is ours.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _sqlite_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for ``url`` (``sqlite:///path.db`` or ``postgresql+psycopg://...``)."""
    try:
        parsed = make_url(url)
    except Exception:
        raise StoreError(f"invalid database URL {describe_db_url(url)}") from None
    if parsed.get_backend_name() == "sqlite":
        engine = sa.create_engine(
            url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}, **kwargs
        )
        configure_sqlite(engine)
        return engine
    if "pool_pre_ping" in kwargs:
        return sa.create_engine(url, **kwargs)
    engine = sa.create_engine(url, **kwargs)
    _ping_when_idle(engine)
    return engine


def _ping_when_idle(engine: Engine) -> None:
    """Check a pooled connection before use if it sat idle for :data:`PING_AFTER_IDLE_S`.

    SQLAlchemy's ``pool_pre_ping`` pings at every checkout: a round trip per transaction,
    which a sender committing batch after batch pays for nothing (a connection returned
    milliseconds ago is as alive as it was). A connection that sat idle longer (the server
    may have restarted or dropped it since) is pinged, and a dead one is replaced before
    the caller sees it. A connection that dies within the idle threshold fails the first
    statement on it instead, and SQLAlchemy then invalidates the pool, as without
    ``pool_pre_ping``.
    """
    dialect = engine.dialect

    @sa.event.listens_for(engine, "checkin")
    def _returned(_dbapi_conn: Any, record: Any) -> None:
        record.info["condmsg_idle_since"] = time.monotonic()

    @sa.event.listens_for(engine, "checkout")
    def _taken(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("condmsg_idle_since")
        if since is None or time.monotonic() - since < PING_AFTER_IDLE_S:
            return  # new, or back in the pool just now
        try:
            dialect.do_ping(dbapi_conn)
        except Exception as exc:
            # The pool discards this connection and checks out another (up to 3 tries).
            raise sa.exc.DisconnectionError(f"stale pooled connection: {exc}") from exc


def check_reachable(engine: Engine) -> None:
    """Raise :class:`StoreError` with an actionable message if the database is down."""
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.OperationalError as exc:
        raise StoreError(
            f"cannot reach the database at {describe_db_url(str(engine.url))}: "
            f"{str(exc.orig).splitlines()[0] if exc.orig else exc}; is it running?"
        ) from None
