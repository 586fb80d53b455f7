"""Writing outbox rows in the caller's transaction: the port and its two adapters.

:class:`OutboxWriter` is what :mod:`outbox.enqueueing` needs of a database: insert rows
(plain or fan-out), insert them and return their ids, insert a :class:`TemplateBatch`.
:class:`SqlAlchemyOutboxWriter` does it with SQLAlchemy Core on any database;
:class:`PsycopgOutboxWriter` sends a batch to PostgreSQL as one ``unnest`` statement with
binary array parameters (see :mod:`outbox.pg`). Both write the same rows for the same
messages (``tests/contract/test_outbox_writer.py``); none of them commits.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from outbox import backends, pg
from outbox.errors import OutboxValueError
from outbox.message import COPY_FIELDS, OutboxMessage, check_body, check_field
from outbox.table import PENDING, outbox_table

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
        if not rows:
            return
        batch = [m for m, _ in rows]
        columns = {c: [getattr(m, c) for m in batch] for c in _PG_ARRAYS if c != "headers"}
        columns["headers"] = [m.headers_text() for m in batch]
        shared = frozenset(c for c in _SHAREABLE if _same(columns[c]))
        params: dict[str, Any] = {"created_at": datetime.now(UTC)}
        for c, values in columns.items():
            params[c] = values[0] if c in shared else values
        fanout = any(c is not None for _, c in rows)
        if fanout:
            params["copies"] = [None if c is None else _json(c) for _, c in rows]
        raw = backends.psycopg_connection(session)
        pg.execute(raw, _pg_insert(table_name, shared, fanout), params)

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
    ``copies`` column when a row of the batch fans out)."""
    constants = {"created_at": "%(created_at)s", "state": f"'{PENDING}'", "attempts": "0"}
    constants |= {c: f"CAST(%({c})s AS {type_})" for c, type_ in _PG_ARRAYS.items() if c in shared}
    arrays = {c: type_ for c, type_ in _PG_ARRAYS.items() if c not in shared}
    if fanout:
        arrays["copies"] = "json"
    return pg.unnest_insert(outbox_table(table_name).name, arrays, constants=constants)
