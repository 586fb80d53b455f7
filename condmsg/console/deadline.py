"""How long a console page may wait for its database, and what it does past that.

Three limits, all set from one timeout (``--db-timeout``, seconds):

- PostgreSQL's ``connect_timeout``: a server that accepts the TCP connection but never
  finishes the handshake (a hung host, a black-holed route behind a proxy) fails the
  connection attempt instead of holding it for the kernel's minutes (psycopg enforces it on
  the client; libpq's convention makes 2 s its minimum);
- PostgreSQL's ``statement_timeout`` (sent as a startup option): a query stuck behind a
  lock or a slow plan is cancelled by the server;
- SQLite's busy timeout: a read waits for a writer's lock at most this long.

None of these helps when a pooled connection's server stops answering (the packets are
acknowledged by a proxy or a half-open route, so neither TCP nor the server gives up):
the read then blocks in the driver forever. So each page runs under a :class:`Watch` that
notes the connections it checks out; once the page's deadline passes, the watch shuts
their sockets down, which wakes the blocked read with an error, and the pool drops the
connection instead of handing it to the next page.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
from typing import Any

import sqlalchemy as sa

from condmsg.runtime.db import make_engine

#: Seconds a page waits for its database by default.
DEFAULT_DB_TIMEOUT_S = 5.0

_current = threading.local()


def console_engine(url: str, timeout_s: float = DEFAULT_DB_TIMEOUT_S) -> sa.Engine:
    """An engine for a store the console reads, with the connect, statement and busy
    timeouts of ``timeout_s`` seconds."""
    parsed = sa.make_url(url)
    if parsed.get_backend_name() != "postgresql":
        engine = make_engine(url)
        busy_ms = int(timeout_s * 1000)

        @sa.event.listens_for(engine, "connect")
        def _busy_timeout(dbapi_conn: Any, _record: Any) -> None:
            # After make_engine's own pragmas, so that this one wins.
            dbapi_conn.execute(f"PRAGMA busy_timeout={busy_ms}")

        return engine
    # URL options (a search_path, say) are kept: connect_args would replace them.
    given = parsed.query.get("options", "")
    options = " ".join([*([given] if isinstance(given, str) else given)])
    options = f"{options} -c statement_timeout={int(timeout_s * 1000)}".strip()
    return make_engine(
        url,
        connect_args={"connect_timeout": max(math.ceil(timeout_s), 2), "options": options},
    )


def watch_engine(engine: sa.Engine) -> None:
    """Let a :class:`Watch` see the connections ``engine`` opens and hands to its thread."""
    if getattr(engine, "_console_watched", False):
        return
    engine._console_watched = True  # type: ignore[attr-defined]

    def _connecting(*_args: Any) -> None:
        watch = getattr(_current, "watch", None)
        if watch is not None:
            watch.engine = engine

    def _checked_out(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        watch = getattr(_current, "watch", None)
        if watch is not None:
            watch.engine = engine
            watch.add(dbapi_conn)

    sa.event.listen(engine, "do_connect", _connecting)
    # First among the checkout listeners: make_engine's ping of an idle connection is one,
    # and it is what blocks when the server stopped answering.
    sa.event.listen(engine, "checkout", _checked_out, insert=True)


class Watch:
    """The connections one page's reads use, so that they can be cut past its deadline."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conns: list[Any] = []
        self.cut = False
        #: The engine the page used last: the one to blame if the page failed.
        self.engine: sa.Engine | None = None

    def run(self, work: Any, *args: Any) -> Any:
        """``work(*args)`` in this thread, watched."""
        _current.watch = self
        try:
            return work(*args)
        finally:
            _current.watch = None

    def add(self, dbapi_conn: Any) -> None:
        with self._lock:
            self._conns.append(dbapi_conn)
            cut = self.cut
        if cut:
            _shut_down(dbapi_conn)

    def cut_all(self) -> None:
        """Shut down every watched connection's socket (and any checked out later)."""
        with self._lock:
            self.cut = True
            conns = list(self._conns)
        for conn in conns:
            _shut_down(conn)


def _shut_down(dbapi_conn: Any) -> None:
    """Shut the socket of a psycopg connection down under it: the read blocked on it
    returns with an error and psycopg marks the connection broken. The socket is reached
    through a duplicate of its descriptor, which psycopg keeps owning and closes itself."""
    with contextlib.suppress(Exception):
        fd = os.dup(dbapi_conn.pgconn.socket)
        with socket.socket(fileno=fd) as sock:
            sock.shutdown(socket.SHUT_RDWR)
