"""Message Sequence reassembly from the receiver store (its parts are kept by the store's
``store_part``, :mod:`ackd.receiver_store`).

Each part of a large copy is stored (and its AMQP message acked) as it arrives, so
competing consumers can share the parts. A sequence whose parts are all stored is
*complete*; whichever consumer takes it first deletes the parts in the transaction that
delivers the whole message, so a rolled-back delivery leaves them for a later read.
A sequence still incomplete after the timeout is moved to the invalid-message queue.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from ackd.broker import Delivery
from ackd.inbound import InvalidMessage
from ackd.tables import sequence_parts as parts


@dataclass(frozen=True, slots=True)
class Assembled:
    """A complete sequence taken from the store: the whole body, and the first part's
    headers and properties as stored (JSON; :func:`metadata_of` decodes them)."""

    seq_id: str
    body: bytes
    headers_json: str
    properties_json: str


def _json_safe(headers: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (v.decode("utf-8", "replace") if isinstance(v, bytes) else v) for k, v in headers.items()
    }


def part_row(
    delivery: Delivery, *, seq_id: str, position: int, size: int, now: datetime
) -> dict[str, Any]:
    """The store row of one part. Encoding its headers can fail on what a sender put in
    them (a table nested too deep for JSON): the receiver judges that before storing."""
    props = delivery.properties
    return {
        "seq_id": seq_id,
        "position": position,
        "size": size,
        "queue": delivery.queue,
        "headers_json": json.dumps(_json_safe(delivery.headers), default=str),
        "properties_json": json.dumps(
            {
                "content_type": props.content_type,
                "message_id": props.message_id,
                "correlation_id": props.correlation_id,
                "reply_to": props.reply_to,
            },
            default=str,
        ),
        "body": delivery.body,
        "received_at": now,
    }


def complete_ids(session: Session, queue: str, limit: int = 10) -> list[str]:
    """Sequences of ``queue`` whose parts are all stored."""
    query = (
        sa.select(parts.c.seq_id)
        .where(parts.c.queue == queue)
        .group_by(parts.c.seq_id, parts.c.size)
        .having(sa.func.count() == parts.c.size)
        .limit(limit)
    )
    return [row.seq_id for row in session.execute(query)]


def take(session: Session, seq_id: str) -> Assembled | None:
    """Assemble and delete a complete sequence; None if another consumer took it first.

    The DELETE ... RETURNING is the claim: on PostgreSQL a concurrent taker blocks on the
    rows and, once the first commits, deletes nothing.
    """
    stmt = (
        sa.delete(parts)
        .where(parts.c.seq_id == seq_id)
        .returning(
            parts.c.position,
            parts.c.size,
            parts.c.body,
            parts.c.headers_json,
            parts.c.properties_json,
        )
    )
    rows = sorted(session.execute(stmt).all(), key=lambda r: r.position)
    if not rows or len(rows) != rows[0].size:
        return None
    first = rows[0]
    return Assembled(
        seq_id=seq_id,
        body=b"".join(r.body for r in rows),
        headers_json=first.headers_json,
        properties_json=first.properties_json,
    )


def metadata_of(assembled: Assembled) -> tuple[dict[str, Any], dict[str, Any]]:
    """The headers and properties of an assembled sequence; raises :class:`InvalidMessage`
    if the stored JSON is not an object."""
    headers, properties = json.loads(assembled.headers_json), json.loads(assembled.properties_json)
    if not isinstance(headers, dict) or not isinstance(properties, dict):
        raise InvalidMessage(f"sequence {assembled.seq_id}: stored headers are not an object")
    return headers, properties


def take_expired(
    session: Session, older_than: datetime
) -> list[tuple[str, int, int, bytes, dict[str, Any]]]:
    """Delete and return the parts of sequences with a part older than ``older_than`` that
    are still incomplete: ``(seq_id, position, size, body, headers)``."""
    stale = (
        sa.select(parts.c.seq_id)
        .group_by(parts.c.seq_id, parts.c.size)
        .having(sa.func.min(parts.c.received_at) < older_than)
        .having(sa.func.count() < parts.c.size)
    )
    ids = [row.seq_id for row in session.execute(stale)]
    if not ids:
        return []
    stmt = (
        sa.delete(parts)
        .where(parts.c.seq_id.in_(ids))
        .returning(
            parts.c.seq_id, parts.c.position, parts.c.size, parts.c.body, parts.c.headers_json
        )
    )
    return [
        (r.seq_id, r.position, r.size, r.body, _stored_headers(r.headers_json))
        for r in session.execute(stmt)
    ]


def _stored_headers(headers_json: str) -> dict[str, Any]:
    """A part's headers for the invalid queue; none if they cannot be decoded (the part
    still goes there, with its body, rather than stopping the expiry of the others)."""
    try:
        headers = json.loads(headers_json)
    except (ValueError, RecursionError):
        return {}
    return headers if isinstance(headers, dict) else {}
