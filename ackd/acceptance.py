"""Accepting or rejecting one AMQP delivery: its condmsg headers, token and payload are
checked (a message that fails goes to the invalid queue with the reason, and the app
never sees it), then a part is stored, a plain message passes and a conditional one
goes to the RLOG decision. What becomes of the delivery at the broker is decided on the
way and carried out once, at the end (:meth:`ackd.broker.Broker.dispose`)."""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from datetime import datetime

from sqlalchemy.orm import Session

from ackd.broker import Delivery, Disposal, Fate
from ackd.context import ReceiveContext
from ackd.message import Message
from ackd.rlog import RlogDecisions
from ackd.sequences import SequenceReassembly
from ackd.transaction import ReceiverTransaction, Taken
from ackd.validation import InvalidMessage, invalid_reason, judge
from condmsg.core import protocol
from condmsg.infra import tracing

log = logging.getLogger(__name__)

#: A delivery taken for good at once, and one that the app's transaction settles.
ACK = Disposal(Fate.ACK)
LEFT = Disposal(Fate.LEFT)


class Acceptance:
    """Judges the deliveries of one receiver and hands on those it accepts."""

    def __init__(
        self, context: ReceiveContext, decisions: RlogDecisions, sequences: SequenceReassembly
    ) -> None:
        self._ctx = context
        self._decisions = decisions
        self._sequences = sequences

    def accept(self, delivery: Delivery, tx: ReceiverTransaction | None) -> Message | None:
        """The message the app gets for ``delivery``, or None (invalid, a stored part, or
        dropped by the RLOG)."""
        read_at = self._ctx.clock()
        try:
            if tracing.active():
                with receive_span(delivery):
                    message, disposal = self._take(delivery, read_at, tx)
            else:
                message, disposal = self._take(delivery, read_at, tx)
            if disposal.fate is Fate.INVALID:
                log.warning(
                    "moving message %s from %r to %s: %s",
                    delivery.properties.message_id,
                    delivery.queue,
                    self._ctx.config.invalid_queue,
                    disposal.reason,
                )
            self._ctx.broker.dispose(delivery, disposal)
        except BaseException:
            # The store or the broker failed (storing, deciding, or copying the message to
            # the invalid queue), not the message: it goes back to its queue (uncounted),
            # after a pause so that a caller retrying at once does not spin on it while the
            # store is down. Settling twice is harmless (see Broker).
            self._ctx.broker.requeue(delivery, after_s=self._ctx.config.retry.delay_s(1))
            raise
        if disposal.fate is Fate.INVALID:
            self._ctx.stats.invalid += 1
        return message

    def _take(
        self, delivery: Delivery, read_at: datetime, tx: ReceiverTransaction | None
    ) -> tuple[Message | None, Disposal]:
        """Judge ``delivery`` and hand it on: the message the app gets (or None), and
        what becomes of the delivery at the broker."""
        try:
            inbound = judge(delivery, self._ctx.config.secret)
        except Exception as exc:  # a codec's bug too costs this message, never the reader
            return None, Disposal(Fate.INVALID, invalid_reason(exc))
        if inbound.seq_id is not None:
            try:
                self._sequences.store_part(delivery, inbound, read_at, tx)
            except InvalidMessage as exc:
                return None, Disposal(Fate.INVALID, str(exc))
            return None, ACK if tx is None else LEFT
        props = delivery.properties
        # Attempts are counted only when a rollback requeues, so a first delivery has none:
        # skip the lookup (a database round trip per message).
        if tx is not None and delivery.redelivered and props.message_id:
            reason = self._ctx.attempts.dead_letter_reason(
                tx.session, props.message_id, self._ctx.config.max_attempts
            )
            if reason is not None:
                return None, Disposal(Fate.INVALID, reason)
        taken = Taken(
            queue=delivery.queue,
            body=delivery.body,
            content_type=props.content_type,
            message_id=props.message_id,
            headers=delivery.headers,
            redelivered=delivery.redelivered,
            delivery=delivery,
            inbound=inbound,
            read_at=read_at,
        )
        if inbound.kind is None:  # a plain message: no RLOG row, no condmsg ack
            if tx is not None:
                tx.keep(taken)
            self._ctx.stats.delivered += 1
            return taken.message(), ACK if tx is None else LEFT
        if tx is not None:
            return self._decisions.decide(tx.session, taken, tx)
        with Session(self._ctx.engine) as session, session.begin():
            return self._decisions.decide(session, taken, None)


def receive_span(delivery: Delivery) -> AbstractContextManager[object]:
    """The span of receiving ``delivery``, a child of the span that sent it (its headers'
    trace context): current while the message is judged, so that a READ ack made then
    carries it."""
    headers = delivery.properties.headers or {}
    props = delivery.properties
    kind, cm_id = headers.get(protocol.H_KIND), headers.get(protocol.H_CM_ID)
    attributes = {
        tracing.SYSTEM: tracing.RABBITMQ,
        tracing.OPERATION_TYPE: "receive",
        tracing.OPERATION_NAME: "receive",
        tracing.DESTINATION: delivery.queue,
        tracing.BODY_SIZE: len(delivery.body),
        **({tracing.MESSAGE_ID: props.message_id} if props.message_id else {}),
        **({tracing.CONVERSATION_ID: props.correlation_id} if props.correlation_id else {}),
        **({"condmsg.kind": kind} if isinstance(kind, str) else {}),
        **({"condmsg.cm_id": cm_id} if isinstance(cm_id, str) else {}),
        **({"condmsg.redelivered": True} if delivery.redelivered else {}),
    }
    return tracing.span(
        f"receive {delivery.queue}", kind="consumer", parent=headers, attributes=attributes
    )
