"""Message Sequence reassembly from the receiver store.

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
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from ackd.broker import Delivery
from ackd.tables import sequence_parts as parts


@dataclass(frozen=True, slots=True)
class Assembled:
    seq_id: str
    body: bytes
    headers: dict[str, Any]
    properties: dict[str, Any]


def _json_safe(headers: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (v.decode("utf-8", "replace") if isinstance(v, bytes) else v) for k, v in headers.items()
    }


def store_part(
    session: Session, delivery: Delivery, *, seq_id: str, position: int, size: int, now: datetime
) -> None:
    """Keep one part (a redelivered part is ignored). Never commits."""
    props = delivery.properties
    values = {
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
            }
        ),
        "body": delivery.body,
        "received_at": now,
    }
    module: Any = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    session.execute(module.insert(parts).values(**values).on_conflict_do_nothing())


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
        headers=json.loads(first.headers_json),
        properties=json.loads(first.properties_json),
    )


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
        (r.seq_id, r.position, r.size, r.body, json.loads(r.headers_json))
        for r in session.execute(stmt)
    ]
