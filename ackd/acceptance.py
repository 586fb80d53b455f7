"""Accepting or rejecting one AMQP delivery: its condmsg headers, token and payload are
checked (a message that fails goes to the invalid queue with the reason, and the app
never sees it), then a part is stored, a plain message passes and a conditional one
goes to the RLOG decision."""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy.orm import Session

from ackd.broker import Delivery
from ackd.context import ReceiveContext
from ackd.message import Message
from ackd.rlog import RlogDecisions
from ackd.sequences import SequenceReassembly, part_row
from ackd.transaction import Incoming, ReceiverTransaction, TakenMessage
from ackd.validation import Inbound, invalid_reason, judge

log = logging.getLogger(__name__)


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
            inbound = judge(delivery, self._ctx.config.secret)
            part = None
            if inbound.seq_id is not None:
                assert inbound.seq_pos is not None and inbound.seq_size
                part = part_row(
                    delivery,
                    seq_id=inbound.seq_id,
                    position=inbound.seq_pos,
                    size=inbound.seq_size,
                    now=read_at,
                )
        except Exception as exc:  # a codec's bug too costs this message, never the reader
            self._move_to_invalid(delivery, invalid_reason(exc))
            return None
        try:
            if part is not None:
                self._sequences.store_part(delivery, inbound, part, tx)
                return None
            return self._deliver_whole(delivery, inbound, read_at, tx)
        except BaseException:
            # The store or the broker failed, not the message: it goes back to its queue
            # (uncounted), after a pause so that a caller retrying at once does not spin
            # on it while the store is down. Settling twice is harmless (see Broker).
            self._ctx.broker.requeue(delivery, after_s=self._ctx.config.retry.delay_s(1))
            raise

    def _deliver_whole(
        self,
        delivery: Delivery,
        inbound: Inbound,
        read_at: datetime,
        tx: ReceiverTransaction | None,
    ) -> Message | None:
        """Deliver a judged whole message (or drop it by the RLOG's decision)."""
        props = delivery.properties
        # Attempts are counted only when a rollback requeues, so a first delivery has none:
        # skip the lookup (a database round trip per message).
        if tx is not None and delivery.redelivered and props.message_id:
            reason = self._ctx.attempts.dead_letter_reason(
                tx.session, props.message_id, self._ctx.config.max_attempts
            )
            if reason is not None:
                self._move_to_invalid(delivery, reason)
                return None
        incoming = Incoming(
            queue=delivery.queue,
            body=delivery.body,
            content_type=props.content_type,
            message_id=props.message_id,
            headers=delivery.headers,
            redelivered=delivery.redelivered,
            delivery=delivery,
        )
        if inbound.kind is None:  # a plain message: no RLOG, no ack
            if tx is None:
                self._ctx.broker.ack(delivery)
            else:
                tx.taken_messages.append(TakenMessage(incoming, inbound, read_at, delivered=False))
            self._ctx.stats.delivered += 1
            return incoming.message(inbound, read_at)
        if tx is not None:
            return self._decisions.decide(tx.session, incoming, inbound, read_at, tx)
        with Session(self._ctx.engine) as session, session.begin():
            message = self._decisions.decide(session, incoming, inbound, read_at, None)
        self._ctx.broker.ack(delivery, deferred=True)  # the RLOG row drops a redelivery
        return message

    def _move_to_invalid(self, delivery: Delivery, reason: str) -> None:
        log.warning(
            "moving message %s from %r to %s: %s",
            delivery.properties.message_id,
            delivery.queue,
            self._ctx.config.invalid_queue,
            reason,
        )
        self._ctx.broker.move_to_invalid(delivery, reason)
        self._ctx.stats.invalid += 1
