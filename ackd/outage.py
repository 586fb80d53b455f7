"""Outages of the receiver's store and broker, told apart from a message's own failure.

A message whose processing fails is tried again after a backoff and, after
``max_attempts`` failures, dead-lettered as poison. A store that cannot be reached is not
the message's fault: counting it would dead-letter good messages during an outage, and
handing each delivery back at once would burn through the prefetch window while nothing
can succeed. So an outage gives the messages back uncounted and pauses consumption until
the store answers again (:class:`condmsg.runtime.pausing.Pause`), with one log line when it starts
and one when it ends.
"""

from __future__ import annotations

from collections.abc import Iterator

import sqlalchemy as sa

from outbox.errors import StoreError

#: SQLSTATEs of a server that cannot serve anyone right now: connection exceptions (08),
#: insufficient resources such as too many connections (53), shutdowns and start-ups.
_OUTAGE_CLASSES = frozenset({"08", "53"})
_OUTAGE_STATES = frozenset({"57P01", "57P02", "57P03"})


class StoreUnavailable(StoreError):
    """The receiver store cannot be reached: nothing the message did, and nothing a retry
    of the same message mends before the store is back."""


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_store_outage(exc: BaseException) -> bool:
    """Is ``exc`` (or an error it was raised from) a lost or refused connection to the
    store, rather than a failure of the statements a message led to?

    A lost connection is what SQLAlchemy invalidates on, a pool that hands out none, or a
    PostgreSQL error of the connection (SQLSTATE 08), of the server's resources (53) or of
    its shutdown; psycopg reports a connection that never opened or broke under it as an
    operational or interface error without a SQLSTATE. A SQLite error without one
    ("database is locked") is not an outage: the file is there.
    """
    for error in _chain(exc):
        if isinstance(error, StoreUnavailable | sa.exc.DisconnectionError | sa.exc.TimeoutError):
            return True
        if not isinstance(error, sa.exc.DBAPIError):
            continue
        if error.connection_invalidated:
            return True
        if not hasattr(error.orig, "sqlstate"):
            continue  # not PostgreSQL's driver
        state = getattr(error.orig, "sqlstate", None)
        if state is None:
            if isinstance(error, sa.exc.OperationalError | sa.exc.InterfaceError):
                return True
        elif state[:2] in _OUTAGE_CLASSES or state in _OUTAGE_STATES:
            return True
    return False
