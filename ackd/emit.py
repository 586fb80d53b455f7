"""Writing acks to the receiver's outbox, inside the transaction that earns them."""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy.orm import Session

from ackd import fastpath
from ackd.inbound import Inbound
from condmsg.acks import AckKind
from condmsg.protocol import ACK_CONTENT_TYPE, ACK_TYPE, AckMessage
from outbox.enqueueing import enqueue_all, row_values
from outbox.message import OutboxMessage


def ack_message(
    inbound: Inbound,
    *,
    kind: AckKind,
    read_at: datetime,
    committed_at: datetime | None,
    recipient: str,
    receiver: str,
) -> OutboxMessage:
    """The outbox message carrying the ack document for ``inbound``.

    The ack goes to the copy's ``reply_to`` (the sender's ack queue) through the default
    exchange, persistent and mandatory: a missing ack queue parks it in the outbox instead
    of losing it.
    """
    assert inbound.cm_id and inbound.destination and inbound.token and inbound.reply_to
    ack = AckMessage(
        ack_id=os.urandom(16).hex(),  # 32 hex digits, as a uuid4's
        cm_id=inbound.cm_id,
        destination=inbound.destination,
        kind=kind,
        read_at=read_at,
        committed_at=committed_at,
        recipient=recipient,
        receiver=receiver,
        token=inbound.token,
    )
    return OutboxMessage(
        exchange="",
        routing_key=inbound.reply_to,
        body=ack.to_json(),
        message_id=ack.ack_id,
        correlation_id=ack.cm_id,
        content_type=ACK_CONTENT_TYPE,
        message_type=ACK_TYPE,
    )


def enqueue_ack(
    session: Session,
    inbound: Inbound,
    *,
    kind: AckKind,
    read_at: datetime,
    committed_at: datetime | None,
    recipient: str,
    receiver: str,
) -> str:
    """Add the ack document for ``inbound`` to the outbox; returns the ack id. Never commits."""
    message = ack_message(
        inbound,
        kind=kind,
        read_at=read_at,
        committed_at=committed_at,
        recipient=recipient,
        receiver=receiver,
    )
    enqueue_all(session, [message])
    return str(message.message_id)


def commit_with_acks(
    session: Session,
    delivered: Sequence[tuple[Inbound, datetime]],
    *,
    committed_at: datetime,
    recipient: str,
    receiver: str,
) -> None:
    """Commit ``session`` with a COMMIT ack for each delivered original (with its
    ``read_at``).

    On PostgreSQL with psycopg the acks and the COMMIT travel in one round trip
    (:mod:`ackd.fastpath`); the ORM is flushed first, so the app's pending objects are
    written before.
    """
    messages = [
        ack_message(
            inbound,
            kind=AckKind.COMMIT,
            read_at=read_at,
            committed_at=committed_at,
            recipient=recipient,
            receiver=receiver,
        )
        for inbound, read_at in delivered
    ]
    raw = fastpath.driver_connection(session) if messages else None
    if raw is None:
        enqueue_all(session, messages)
        session.commit()
        return
    session.flush()
    now = datetime.now(UTC)
    statements = [fastpath.ack_statement(row_values(message, now)) for message in messages]
    fastpath.execute_and_commit(raw, statements)
    # The database transaction is committed; this ends the session's own bookkeeping (a
    # COMMIT with no transaction open is not sent).
    session.commit()
