"""Adding messages to the outbox inside the caller's transaction.

Nothing here commits, flushes ORM objects or opens a transaction of its own: the rows become
visible to the relay exactly when the caller's transaction commits, together with the
business rows written in it (and vanish with them on rollback).

The functions (:func:`enqueue` and its kin) check the messages and hand the rows to an
:class:`OutboxWriter`, the port to the database, picked by the session's bind with one lookup
per call: :class:`SqlAlchemyOutboxWriter` writes with SQLAlchemy Core on any database;
:class:`PsycopgOutboxWriter` sends a batch to PostgreSQL as one ``unnest`` statement with
binary array parameters (see :mod:`condmsg.infra.fastpaths.pg`). Both write the same rows for
the same messages (``tests/contract/test_outbox_writer.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from condmsg.infra import backends
from condmsg.infra.fastpaths import pg
from outbox.errors import OutboxTypeError, OutboxValueError
from outbox.message import (
    COPY_FIELDS,
    Fanout,
    HeaderValue,
    OutboxMessage,
    check_body,
    check_field,
    copy_message,
)
from outbox.table import DEFAULT_TABLE_NAME, PENDING, outbox_table

__all__ = [
    "OutboxWriter",
    "PsycopgOutboxWriter",
    "Row",
    "SqlAlchemyOutboxWriter",
    "TemplateBatch",
    "enqueue",
    "enqueue_all",
    "enqueue_batch",
    "enqueue_fanouts",
    "enqueue_many",
    "fanout_row",
    "fanouts_statement",
    "row_values",
]


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
    return _writer(session).insert_returning_ids(session, batch, table_name)


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
    _writer(session).insert(session, [(m, None) for m in batch], table_name)
    return len(batch)


def enqueue_batch(
    session: Session | Connection,
    template: OutboxMessage,
    bodies: Sequence[bytes],
    message_ids: Sequence[str | None],
    correlation_ids: Sequence[str | None],
    *,
    table_name: str = DEFAULT_TABLE_NAME,
) -> int:
    """Add one message per body: ``template`` with that body, message id and correlation
    id (a batch of outcome notifications to one queue); returns how many were added.
    Never commits.

    The rows are those :func:`enqueue_all` writes for the same messages, without building
    and checking one :class:`OutboxMessage` per row: the template was checked when it was
    built, the bodies and ids are checked here, and on PostgreSQL the template's values
    are bound once each.
    """
    batch = TemplateBatch(
        template=template, bodies=bodies, message_ids=message_ids, correlation_ids=correlation_ids
    )
    _writer(session).insert_batch(session, batch, table_name)
    return len(bodies)


def enqueue_fanouts(
    session: Session | Connection,
    fanouts: Iterable[Fanout | Sequence[OutboxMessage]],
    *,
    table_name: str = DEFAULT_TABLE_NAME,
) -> int:
    """Add groups of messages that share one body, one row per group; return how many
    messages were added. Never commits.

    A group is stored once: its body and the properties and headers its messages share in
    the row's columns, and per message only what differs (routing key, message id, its own
    headers ...). The relay publishes every message of the group, each with the row id in
    ``x-outbox-id`` and its position in the group in ``x-outbox-copy``, and settles them
    one by one (a row whose messages were partly refused is written back with the others
    only). A group of one is a plain row, as :func:`enqueue_all` writes it. The way to
    send one payload to many destinations: the database stores and deletes one row, not
    one per destination.

    A group is a sequence of messages (what they share is found here) or a
    :class:`~outbox.message.Fanout` that already says it (cheaper for a caller that
    builds its copies from one template).
    """
    rows, count = _fanout_rows(fanouts)
    _writer(session).insert(session, rows, table_name)
    return count


def fanouts_statement(
    fanouts: Iterable[Fanout | Sequence[OutboxMessage]],
    *,
    table_name: str = DEFAULT_TABLE_NAME,
) -> tuple[str, dict[str, Any]] | None:
    """The INSERT that :func:`enqueue_fanouts` sends to PostgreSQL through psycopg, with
    its parameters, unsent (None when there is nothing to write): for a caller that sends
    it as the last part of a statement of its own (a sender's CM rows and their outbox rows
    in one round trip). Run it with :func:`condmsg.infra.fastpaths.pg.execute`; its
    parameters are named after the outbox's columns, so the caller's must be named
    otherwise."""
    rows, _ = _fanout_rows(fanouts)
    return _PSYCOPG.statement(rows, table_name) if rows else None


def _fanout_rows(fanouts: Iterable[Fanout | Sequence[OutboxMessage]]) -> tuple[list[Row], int]:
    """The rows of ``fanouts`` (see :func:`enqueue_fanouts`), and how many messages."""
    rows: list[Row] = []
    count = 0
    for group in fanouts:
        if isinstance(group, Fanout):
            count += len(group.copies)
            if len(group.copies) == 1:  # a plain row: no copies column to write and read
                rows.append((copy_message(group.message, group.copies[0]), None))
            else:
                rows.append((group.message, [{"n": n, **c} for n, c in enumerate(group.copies)]))
            continue
        messages = _checked(group, "enqueue_fanouts")
        count += len(messages)
        if len(messages) == 1:
            rows.append((messages[0], None))
        elif messages:
            rows.append(fanout_row(messages))
    return rows, count


def fanout_row(messages: Sequence[OutboxMessage]) -> tuple[OutboxMessage, list[dict[str, Any]]]:
    """The shared message and the per-copy fields of a fan-out row (see enqueue_fanouts)."""
    first = messages[0]
    body = first.body
    for m in messages:
        if m.body is not body and m.body != body:
            raise OutboxValueError("the messages of a fan-out share one body")
    heads = [m.headers for m in messages]
    if any(h is None for h in heads) and any(h is not None for h in heads):
        raise OutboxValueError("the messages of a fan-out all have headers or none has")
    first_headers = heads[0]
    common: dict[str, Any] | None = None
    if first_headers is not None:
        common = {
            k: v for k, v in first_headers.items() if all(_same_value(h, k, v) for h in heads[1:])
        }
    copies: list[dict[str, Any]] = []
    for n, m in enumerate(messages):
        copy: dict[str, Any] = {"n": n}
        for name in COPY_FIELDS:
            value = getattr(m, name)
            if value != getattr(first, name) or type(value) is not type(getattr(first, name)):
                copy[name] = value
        if m.headers is not None and common is not None:
            own = {k: v for k, v in m.headers.items() if k not in common}
            if own:
                copy["headers"] = own
        copies.append(copy)
    base = OutboxMessage.trusted(
        **{name: getattr(first, name) for name in COPY_FIELDS}, body=body, headers=common
    )
    return base, copies


def _same_value(headers: Mapping[str, Any] | None, key: str, value: Any) -> bool:
    """``headers[key]`` is ``value``, of the same JSON type (``1`` is not ``True``)."""
    if headers is None or key not in headers:
        return False
    other = headers[key]
    if type(other) is not type(value):
        return False
    if isinstance(value, dict | list):
        return json.dumps(other, sort_keys=True) == json.dumps(value, sort_keys=True)
    return bool(other == value)


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


# -- the port and its adapters ------------------------------------------------------------

#: One row to write: the message (for a fan-out, what its copies share) and the copies'
#: own fields (``None``: a plain row).
Row = tuple[OutboxMessage, list[dict[str, Any]] | None]


def row_values(
    message: OutboxMessage, now: datetime, copies: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The outbox row of ``message`` as column values (``created_at`` = ``now``); with
    ``copies``, a fan-out row (``message`` holds what the copies share)."""
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
        "copies": copies,
    }


class OutboxWriter(Protocol):
    """Adds pending rows to an outbox table inside the caller's transaction; never commits."""

    def insert(self, session: Session | Connection, rows: Sequence[Row], table_name: str) -> None:
        """Write ``rows`` (``created_at`` = now, UTC)."""

    def insert_returning_ids(
        self, session: Session | Connection, messages: Sequence[OutboxMessage], table_name: str
    ) -> list[int]:
        """Write one plain row per message; their ids, in the order of ``messages``."""

    def insert_batch(
        self, session: Session | Connection, batch: TemplateBatch, table_name: str
    ) -> None:
        """Write the rows of ``batch``, in its order."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TemplateBatch:
    """Messages that are ``template`` but for their body, message id and correlation id
    (a batch of outcome notifications to one queue): row ``i`` has ``bodies[i]``,
    ``message_ids[i]`` and ``correlation_ids[i]``.

    Built only from valid values (the template was checked when it was built): a body
    that is not bytes, an id that is not a valid short string or sequences of different
    lengths raise ``OutboxTypeError``/``OutboxValueError`` here, before anything is written.
    """

    template: OutboxMessage
    bodies: Sequence[bytes]
    message_ids: Sequence[str | None]
    correlation_ids: Sequence[str | None]

    def __post_init__(self) -> None:
        n = len(self.bodies)
        if len(self.message_ids) != n or len(self.correlation_ids) != n:
            raise OutboxValueError("enqueue_batch needs one message id and correlation id per body")
        for body in self.bodies:
            check_body(body)
        for name, values in (
            ("message_id", self.message_ids),
            ("correlation_id", self.correlation_ids),
        ):
            for value in values:
                check_field(name, value)

    def messages(self) -> list[OutboxMessage]:
        """One message per row (what the portable adapter writes)."""
        rows = zip(self.bodies, self.message_ids, self.correlation_ids, strict=True)
        return [
            dataclasses.replace(self.template, body=b, message_id=m, correlation_id=c)
            for b, m, c in rows
        ]


class SqlAlchemyOutboxWriter:
    """:class:`OutboxWriter` on SQLAlchemy Core: an executemany, on any database."""

    def insert(self, session: Session | Connection, rows: Sequence[Row], table_name: str) -> None:
        if not rows:
            return
        now = datetime.now(UTC)
        session.execute(
            sa.insert(outbox_table(table_name)), [row_values(m, now, c) for m, c in rows]
        )

    def insert_returning_ids(
        self, session: Session | Connection, messages: Sequence[OutboxMessage], table_name: str
    ) -> list[int]:
        if not messages:
            return []
        table = outbox_table(table_name)
        now = datetime.now(UTC)
        # sort_by_parameter_order: SQLAlchemy's insertmanyvalues returns the ids in the order
        # of the parameter list, whatever order the database produced them in.
        stmt = sa.insert(table).returning(table.c.id, sort_by_parameter_order=True)
        result = session.execute(stmt, [row_values(m, now) for m in messages])
        return [int(row[0]) for row in result]

    def insert_batch(
        self, session: Session | Connection, batch: TemplateBatch, table_name: str
    ) -> None:
        self.insert(session, [(m, None) for m in batch.messages()], table_name)


class PsycopgOutboxWriter(SqlAlchemyOutboxWriter):
    """:class:`OutboxWriter` for PostgreSQL through psycopg 3: a batch is one statement.

    A column whose value every row of a batch shares (the exchange, reply-to, content type
    ... of a batch of copies or acks) is bound once instead of as an array. Ids are fetched
    through SQLAlchemy's RETURNING (the inherited :meth:`insert_returning_ids`).
    """

    def insert(self, session: Session | Connection, rows: Sequence[Row], table_name: str) -> None:
        if rows:
            pg.execute(backends.psycopg_connection(session), *self.statement(rows, table_name))

    def statement(self, rows: Sequence[Row], table_name: str) -> tuple[str, dict[str, Any]]:
        """The one INSERT of ``rows`` (at least one) and its parameters."""
        batch = [m for m, _ in rows]
        columns = {c: [getattr(m, c) for m in batch] for c in _PG_ARRAYS if c != "headers"}
        columns["headers"] = [m.headers_text() for m in batch]
        columns["copies"] = [None if c is None else _json(c) for _, c in rows]
        fanout = any(c is not None for c in columns["copies"])
        if not fanout:
            del columns["copies"]
        # A row alone shares every value with itself: one plain VALUES row, no arrays to
        # build, send and unnest (what a single send writes).
        shared = (
            frozenset(columns)
            if len(rows) == 1
            else frozenset(c for c in _SHAREABLE if _same(columns[c]))
        )
        params: dict[str, Any] = {"created_at": datetime.now(UTC)}
        for c, values in columns.items():
            params[c] = values[0] if c in shared else values
        return _pg_insert(table_name, shared, fanout), params

    def insert_batch(
        self, session: Session | Connection, batch: TemplateBatch, table_name: str
    ) -> None:
        n = len(batch.bodies)
        if not n:
            return
        # The template's values are bound once each, without a message object per row.
        template = batch.template
        params: dict[str, Any] = {"created_at": datetime.now(UTC)}
        params |= {c: getattr(template, c) for c in _BATCH_SHARED}
        params |= {
            "body": list(batch.bodies),
            "message_id": list(batch.message_ids),
            "correlation_id": list(batch.correlation_ids),
            "headers": [template.headers_text()] * n,
        }
        raw = backends.psycopg_connection(session)
        pg.execute(raw, _pg_insert(table_name, _BATCH_SHARED), params)


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


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
_SHAREABLE = tuple(c for c in COPY_FIELDS if c != "message_id")

#: What the rows of an :meth:`OutboxWriter.insert_batch` share (the template's).
_BATCH_SHARED = frozenset(c for c in COPY_FIELDS if c not in ("message_id", "correlation_id"))


def _same(values: list[Any]) -> bool:
    first = values[0]
    return all(v == first for v in values)


@functools.cache
def _pg_insert(table_name: str, shared: frozenset[str], fanout: bool = False) -> str:
    """The batch insert, with the ``shared`` columns bound as one value each (and the
    ``copies`` column when a row of the batch fans out); with every column shared, the
    insert of that one row."""
    types = _PG_ARRAYS | {"copies": "json"} if fanout else _PG_ARRAYS
    constants = {"created_at": "%(created_at)s", "state": f"'{PENDING}'", "attempts": "0"}
    constants |= {c: f"CAST(%({c})s AS {type_})" for c, type_ in types.items() if c in shared}
    arrays = {c: type_ for c, type_ in types.items() if c not in shared}
    table = outbox_table(table_name).name
    if not arrays:
        return (
            f"INSERT INTO {table} ({', '.join(constants)}) VALUES ({', '.join(constants.values())})"
        )
    return pg.unnest_insert(table, arrays, constants=constants)


#: One adapter of each kind serves every database (they hold no state).
_PSYCOPG = PsycopgOutboxWriter()
_PORTABLE = SqlAlchemyOutboxWriter()


def _writer(session: Session | Connection) -> OutboxWriter:
    return backends.pick(session, psycopg=_PSYCOPG, portable=_PORTABLE)
