"""Writing acks to the receiver's outbox, inside the transaction that earns them."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy.orm import Session

from ackd.inbound import Inbound
from condmsg.acks import AckKind
from condmsg.protocol import ACK_CONTENT_TYPE, ACK_TYPE, AckMessage
from outbox.enqueue import enqueue_many
from outbox.message import OutboxMessage


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
    """Add the ack document for ``inbound`` to the outbox; returns the ack id. Never commits.

    The ack goes to the copy's ``reply_to`` (the sender's ack queue) through the default
    exchange, persistent and mandatory: a missing ack queue parks it in the outbox instead
    of losing it.
    """
    assert inbound.cm_id and inbound.destination and inbound.token and inbound.reply_to
    ack = AckMessage(
        ack_id=uuid.uuid4().hex,
        cm_id=inbound.cm_id,
        destination=inbound.destination,
        kind=kind,
        read_at=read_at,
        committed_at=committed_at,
        recipient=recipient,
        receiver=receiver,
        token=inbound.token,
    )
    enqueue_many(
        session,
        [
            OutboxMessage(
                exchange="",
                routing_key=inbound.reply_to,
                body=ack.to_json(),
                message_id=ack.ack_id,
                correlation_id=ack.cm_id,
                content_type=ACK_CONTENT_TYPE,
                message_type=ACK_TYPE,
            )
        ],
    )
    return ack.ack_id
