"""Writing acks to the receiver's outbox, inside the transaction that earns them."""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime

from sqlalchemy.orm import Session

from ackd.receiver_store import ReceiverStore
from ackd.validation import Inbound
from condmsg.core.acks import AckKind
from condmsg.core.protocol import ACK_CONTENT_TYPE, ACK_TYPE, AckMessage
from condmsg.infra import tracing
from outbox.enqueueing import enqueue_all
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
        headers=_trace_headers(inbound),
    )


def _trace_headers(inbound: Inbound) -> dict[str, str] | None:
    """The trace context an ack carries (docs/protocol.md, *Trace context*): the span that
    earned it when this process traces, else the copy's own, passed on unchanged."""
    if tracing.active():
        return tracing.current_headers() or None
    if inbound.traceparent is None:
        return None
    found = {tracing.TRACEPARENT: inbound.traceparent}
    if inbound.tracestate is not None:
        found[tracing.TRACESTATE] = inbound.tracestate
    return found


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
    store: ReceiverStore,
    session: Session,
    delivered: Sequence[tuple[Inbound, datetime]],
    *,
    committed_at: datetime,
    recipient: str,
    receiver: str,
) -> None:
    """Commit ``session`` with a COMMIT ack for each delivered original (with its
    ``read_at``), through ``store``: the app's writes and the acks commit together."""
    messages = []
    for inbound, read_at in delivered:
        with settle_span(inbound):
            messages.append(
                ack_message(
                    inbound,
                    kind=AckKind.COMMIT,
                    read_at=read_at,
                    committed_at=committed_at,
                    recipient=recipient,
                    receiver=receiver,
                )
            )
    store.commit_with_acks(session, messages)


def settle_span(inbound: Inbound) -> AbstractContextManager[object]:
    """The span of settling ``inbound`` with a COMMIT ack, a child of the span that sent
    it (the ack carries this span's context); nothing without tracing."""
    if not tracing.active():
        return nullcontext()
    return tracing.span(
        f"settle {inbound.destination}",
        kind="consumer",
        parent={tracing.TRACEPARENT: inbound.traceparent} if inbound.traceparent else None,
        attributes={
            tracing.SYSTEM: tracing.RABBITMQ,
            tracing.OPERATION_TYPE: "settle",
            tracing.OPERATION_NAME: "commit-ack",
            tracing.DESTINATION: inbound.destination,
            tracing.CONVERSATION_ID: inbound.cm_id,
            "condmsg.cm_id": inbound.cm_id,
            "condmsg.ack.kind": AckKind.COMMIT.value,
        },
    )
