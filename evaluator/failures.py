"""Failures of the environment (the database, the broker) told apart from the acks' own,
and the waits between tries while the environment is away (an
:class:`condmsg.infra.backoff.Backoff` from :data:`FIRST_RETRY_S` to :data:`MAX_RETRY_S`)."""

from __future__ import annotations

import pika.exceptions
import sqlalchemy as sa

from condmsg.core.errors import BrokerError

#: Waits between tries while the database or the broker is unreachable: doubled from the
#: first to the last (at start, and before a batch that failed for that is handed back).
FIRST_RETRY_S = 0.5
MAX_RETRY_S = 30.0

#: The SQLSTATE classes an ack's own values can cause: data exceptions, integrity
#: constraint violations.
_DATA_SQLSTATE_CLASSES = frozenset({"22", "23"})


def is_transient(exc: BaseException) -> bool:
    """Is ``exc`` about the database or the broker (unreachable, busy, or not the schema
    the evaluator expects) rather than about the acks being stored? Such a failure is
    retried later with the same batch: splitting it would blame, and dead-letter, every
    genuine ack in turn.

    What the acks can cause is a data exception (SQLSTATE class 22: a value too long, a
    character a column cannot hold) or an integrity violation (23), or an error raised in
    Python while decoding or judging them (also one SQLAlchemy wraps while binding a
    value, a ``StatementError``); everything else the database reports (a lost
    connection, a deadlock, a missing column or table, a refused permission, a shutdown)
    is the environment's, and so are SQLAlchemy's own errors about connections and
    sessions (a pool that times out, a session that must be rolled back) and operating
    system errors. A driver error without a SQLSTATE is the environment's when it is an
    operational or interface error (no server answered), else the data's (psycopg refuses
    some values before sending them).
    """
    if isinstance(exc, (BrokerError, pika.exceptions.AMQPError, OSError)):
        return True
    if not isinstance(exc, sa.exc.SQLAlchemyError):
        return False
    if not isinstance(exc, sa.exc.DBAPIError):
        return not isinstance(exc, sa.exc.StatementError)
    if exc.connection_invalidated:
        return True
    sqlstate = getattr(exc.orig, "sqlstate", None)
    if sqlstate is None:
        return isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError))
    return str(sqlstate)[:2] not in _DATA_SQLSTATE_CLASSES
