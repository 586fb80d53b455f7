"""Adding messages to the outbox inside the caller's transaction.

Nothing here commits, flushes ORM objects or opens a transaction of its own: the rows become
visible to the relay exactly when the caller's transaction commits, together with the
business rows written in it (and vanish with them on rollback).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from outbox import pg
from outbox.errors import OutboxTypeError
from outbox.message import HeaderValue, OutboxMessage
from outbox.table import DEFAULT_TABLE_NAME, PENDING, outbox_table


def row_values(message: OutboxMessage, now: datetime) -> dict[str, Any]:
    """The outbox row of ``message`` as column values (``created_at`` = ``now``)."""
    return {
        "created_at": now,
        "state": PENDING,
        "exchange": message.exchange,
        "routing_key": message.routing_key,
        "body": message.body,
        "message_id": message.message_id,
        "correlation_id": message.correlation_id,
        "reply_to": message.reply_to,
        "content_type": message.content_type,
        "content_encoding": message.content_encoding,
        "message_type": message.message_type,
        "headers": message.headers_json(),
        "priority": message.priority,
        "expiration_ms": message.expiration_ms,
        "persistent": message.persistent,
        "mandatory": message.mandatory,
        "attempts": 0,
    }


def enqueue_many(
    session: Session | Connection,
    messages: Iterable[OutboxMessage],
    *,
    table_name: str = DEFAULT_TABLE_NAME,
) -> list[int]:
    """Add ``messages`` to the outbox in the caller's open transaction; return their ids.

    The ids are in the order of ``messages``. One multi-row INSERT is sent (a fan-out of N
    copies costs one round trip, not N). Never commits.
    """
    batch = _checked(messages, "enqueue_many")
    if not batch:
        return []
    table = outbox_table(table_name)
    now = datetime.now(UTC)
    # sort_by_parameter_order: SQLAlchemy's insertmanyvalues returns the ids in the order of
    # the parameter list, whatever order the database produced them in.
    stmt = sa.insert(table).returning(table.c.id, sort_by_parameter_order=True)
    result = session.execute(stmt, [row_values(m, now) for m in batch])
    return [int(row[0]) for row in result]


def enqueue_all(
    session: Session | Connection,
    messages: Iterable[OutboxMessage],
    *,
    table_name: str = DEFAULT_TABLE_NAME,
) -> int:
    """Like :func:`enqueue_many` without fetching the ids back; returns how many were added.

    The cheaper path for callers that do not need the ids: no RETURNING, so the driver
    sends the rows as one statement of column arrays (psycopg) instead of a multi-row
    statement with one parameter per value.
    """
    batch = _checked(messages, "enqueue_all")
    if not batch:
        return 0
    now = datetime.now(UTC)
    raw = pg.driver_connection(session)
    if raw is not None:
        # One statement for the whole batch (see outbox.pg). A column whose value every
        # row shares (the exchange, reply-to, content type ... of a batch of copies or
        # acks) is bound once instead of as an array.
        columns = {c: [getattr(m, c) for m in batch] for c in _PG_ARRAYS if c != "headers"}
        columns["headers"] = [m.headers_text() for m in batch]
        shared = frozenset(c for c in _SHAREABLE if _same(columns[c]))
        params: dict[str, Any] = {"created_at": now}
        for c, values in columns.items():
            params[c] = values[0] if c in shared else values
        pg.execute(raw, _pg_insert(table_name, shared), params)
    else:
        session.execute(sa.insert(outbox_table(table_name)), [row_values(m, now) for m in batch])
    return len(batch)


#: The PostgreSQL element types of the columns that vary between enqueued rows.
_PG_ARRAYS = {
    "exchange": "text",
    "routing_key": "text",
    "body": "bytea",
    "message_id": "text",
    "correlation_id": "text",
    "reply_to": "text",
    "content_type": "text",
    "content_encoding": "text",
    "message_type": "text",
    "headers": "json",
    "priority": "smallint",
    "expiration_ms": "bigint",
    "persistent": "boolean",
    "mandatory": "boolean",
}


#: The properties a batch's rows often share (bodies, ids and headers are the message's own).
_SHAREABLE = (
    "exchange",
    "routing_key",
    "reply_to",
    "content_type",
    "content_encoding",
    "message_type",
    "priority",
    "expiration_ms",
    "persistent",
    "mandatory",
)


def _same(values: list[Any]) -> bool:
    first = values[0]
    return all(v == first for v in values)


@functools.cache
def _pg_insert(table_name: str, shared: frozenset[str]) -> str:
    """The batch insert, with the ``shared`` columns bound as one value each."""
    constants = {"created_at": "%(created_at)s", "state": f"'{PENDING}'", "attempts": "0"}
    constants |= {c: f"CAST(%({c})s AS {type_})" for c, type_ in _PG_ARRAYS.items() if c in shared}
    arrays = {c: type_ for c, type_ in _PG_ARRAYS.items() if c not in shared}
    return pg.unnest_insert(outbox_table(table_name).name, arrays, constants=constants)


def _checked(messages: Iterable[OutboxMessage], caller: str) -> list[OutboxMessage]:
    batch = list(messages)
    for message in batch:
        if not isinstance(message, OutboxMessage):
            raise OutboxTypeError(
                f"{caller}() takes OutboxMessage objects, got {type(message).__name__}"
            )
    return batch


def enqueue(
    session: Session | Connection,
    *,
    exchange: str,
    routing_key: str,
    body: bytes,
    message_id: str | None = None,
    correlation_id: str | None = None,
    reply_to: str | None = None,
    content_type: str | None = None,
    content_encoding: str | None = None,
    message_type: str | None = None,
    headers: Mapping[str, HeaderValue] | None = None,
    priority: int | None = None,
    expiration_ms: int | None = None,
    persistent: bool = True,
    mandatory: bool = True,
    table_name: str = DEFAULT_TABLE_NAME,
) -> int:
    """Add one message to the outbox in the caller's open transaction; return its id.

    Raises :class:`~outbox.errors.OutboxTypeError` / ``OutboxValueError`` for a bad message
    (e.g. a ``str`` body) before anything is written. Never commits.
    """
    message = OutboxMessage(
        exchange=exchange,
        routing_key=routing_key,
        body=body,
        message_id=message_id,
        correlation_id=correlation_id,
        reply_to=reply_to,
        content_type=content_type,
        content_encoding=content_encoding,
        message_type=message_type,
        headers=headers,
        priority=priority,
        expiration_ms=expiration_ms,
        persistent=persistent,
        mandatory=mandatory,
    )
    return enqueue_many(session, [message], table_name=table_name)[0]
