"""The async receiver's store on PostgreSQL through psycopg's ``AsyncConnection``: the
transactional read path's two statements travel with the ``BEGIN`` and the ``COMMIT`` the
app's transaction sends anyway, as on the sync receiver's psycopg fast path
(:mod:`ackd.fastpath`), here through psycopg's pipeline mode.

The sync fast path sends several statements as one simple-protocol string over libpq's
blocking calls, which an async connection does not offer and which would hold the event
loop. Pipeline mode is psycopg's own way to send several statements, with bound
parameters, and to await their results once: the claim of an original (an ``INSERT ...
ON CONFLICT DO NOTHING RETURNING``, the portable adapter's own statement, compiled by
SQLAlchemy) goes out with the ``BEGIN`` psycopg opens the transaction with, and the COMMIT
ack's outbox row with the ``COMMIT``. The statements run on the session's own connection,
so they belong to the app's transaction exactly as the portable statements would; every
other statement is the portable adapter's.

Chosen as the sync fast path is (:func:`ackd.fastpath.chosen`: a psycopg release it was
tested with, ``CONDMSG_RECEIVER_FASTPATH``); the portable adapter otherwise.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.orm import Session
from sqlalchemy.util import await_only

from ackd.receiver_store import SqlAlchemyReceiverStore, _insert_new
from outbox.enqueueing import row_values
from outbox.message import OutboxMessage
from outbox.pg import wrapped
from outbox.table import outbox_table

__all__ = ["AsyncPsycopgReceiverStore"]


class AsyncPsycopgReceiverStore(SqlAlchemyReceiverStore):
    """:class:`~ackd.receiver_store.ReceiverStore` whose claims and COMMIT acks are sent in
    psycopg pipelines on the session's async connection (stateless)."""

    def claim(self, session: Session, table: sa.Table, row: Mapping[str, Any]) -> bool:
        conn = session.connection()
        sql = _compiled(conn.dialect, table, tuple(row))
        return bool(await_only(_claim(_driver(conn), sql, row)))

    def commit_with_acks(self, session: Session, acks: Sequence[OutboxMessage]) -> None:
        if not acks:
            super().commit_with_acks(session, acks)
            return
        session.flush()  # the app's pending ORM objects are written before the acks
        conn = session.connection()
        now = datetime.now(UTC)
        rows = [row_values(message, now) for message in acks]
        sql = _compiled(conn.dialect, outbox_table(), tuple(rows[0]), insert_only=True)
        await_only(_insert_and_commit(_driver(conn), sql, rows))
        # The database transaction is committed; this ends the session's own bookkeeping
        # (psycopg sends no COMMIT when no transaction is open).
        session.commit()


def _driver(conn: sa.Connection) -> psycopg.AsyncConnection[Any]:
    driver = conn.connection.driver_connection
    assert isinstance(driver, psycopg.AsyncConnection)
    return driver


@functools.lru_cache(maxsize=64)
def _compiled(
    dialect: sa.Dialect, table: sa.Table, keys: tuple[str, ...], *, insert_only: bool = False
) -> str:
    """The SQL of the portable adapter's claim of ``table`` (or a plain insert), with
    psycopg's named placeholders for ``keys``."""
    statement = sa.insert(table) if insert_only else _insert_new(dialect.name, table)
    return str(statement.compile(dialect=dialect, column_keys=list(keys)))


async def _claim(conn: psycopg.AsyncConnection[Any], sql: str, row: Mapping[str, Any]) -> bool:
    try:
        async with conn.pipeline():  # with the BEGIN psycopg sends, if this one opens it
            cursor = await conn.execute(sql, row)
        return await cursor.fetchone() is not None
    except psycopg.Error as exc:
        raise wrapped(sql, row, exc) from exc


async def _insert_and_commit(
    conn: psycopg.AsyncConnection[Any], sql: str, rows: Sequence[Mapping[str, Any]]
) -> None:
    try:
        async with conn.pipeline():  # the acks and the COMMIT in one round trip
            async with conn.cursor() as cursor:
                await cursor.executemany(sql, rows)
            await conn.commit()
    except psycopg.Error as exc:
        raise wrapped(sql, rows[0], exc) from exc
