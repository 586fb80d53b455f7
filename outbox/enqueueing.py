"""Adding messages to the outbox inside the caller's transaction.

Nothing here commits, flushes ORM objects or opens a transaction of its own: the rows become
visible to the relay exactly when the caller's transaction commits, together with the
business rows written in it (and vanish with them on rollback). The session's bind decides,
with one lookup per call, which :class:`~outbox.writer.OutboxWriter` writes the rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from outbox import backends
from outbox.errors import OutboxTypeError, OutboxValueError
from outbox.message import COPY_FIELDS, Fanout, HeaderValue, OutboxMessage, copy_message
from outbox.table import DEFAULT_TABLE_NAME
from outbox.writer import (
    OutboxWriter,
    PsycopgOutboxWriter,
    Row,
    SqlAlchemyOutboxWriter,
    TemplateBatch,
    row_values,
)

__all__ = [
    "enqueue",
    "enqueue_all",
    "enqueue_batch",
    "enqueue_fanouts",
    "enqueue_many",
    "fanout_row",
    "row_values",
]

#: One adapter of each kind serves every database (they hold no state).
_PSYCOPG = PsycopgOutboxWriter()
_PORTABLE = SqlAlchemyOutboxWriter()


def _writer(session: Session | Connection) -> OutboxWriter:
    return backends.pick(session, psycopg=_PSYCOPG, portable=_PORTABLE)


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
    _writer(session).insert(session, rows, table_name)
    return count


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
