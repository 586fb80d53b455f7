"""Accepting or rejecting one AMQP delivery: its condmsg headers, token and payload are
checked (a message that fails goes to the invalid queue with the reason, and the app
never sees it), then a part is stored, a plain message passes and a conditional one
goes to the RLOG decision."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from ackd import sequence
from ackd.attempts import AttemptCounts, RetryPolicy
from ackd.broker import Broker, Delivery
from ackd.decisions import RlogDecisions
from ackd.inbound import (
    Inbound,
    InvalidMessage,
    check_message_id,
    check_payload,
    check_token,
    parse,
)
from ackd.incoming import (
    Incoming,
    ReceiverStats,
    ReceiverTransaction,
    TakenMessage,
    message_for,
    undecodable,
)
from ackd.message import Message
from ackd.reassembly import SequenceReassembly

log = logging.getLogger(__name__)


class Intake:
    """Judges the deliveries of one receiver and hands on those it accepts."""

    def __init__(
        self,
        *,
        engine: Engine,
        broker: Broker,
        stats: ReceiverStats,
        decisions: RlogDecisions,
        sequences: SequenceReassembly,
        attempts: AttemptCounts,
        retry: RetryPolicy,
        clock: Callable[[], datetime],
        secret: bytes | None,
        invalid_queue: str,
    ) -> None:
        self._engine = engine
        self._broker = broker
        self._stats = stats
        self._decisions = decisions
        self._sequences = sequences
        self._attempts = attempts
        self._retry = retry
        self._clock = clock
        self._secret = secret
        self._invalid_queue = invalid_queue

    def accept(self, delivery: Delivery, tx: ReceiverTransaction | None) -> Message | None:
        """The message the app gets for ``delivery``, or None (invalid, a stored part, or
        dropped by the RLOG)."""
        read_at = self._clock()
        props = delivery.properties
        try:
            inbound = parse(delivery.headers, props.reply_to)
            check_message_id(props.message_id, inbound)
            check_token(inbound, self._secret, delivery.body)
        except InvalidMessage as exc:
            self._move_to_invalid(delivery, str(exc))
            return None
        except Exception as exc:  # a codec's bug costs this message, never the reader
            self._move_to_invalid(delivery, undecodable(exc))
            return None
        try:
            part = self._part_row(delivery, inbound, read_at)
            if part is None:
                check_payload(delivery.body, props.content_type)
        except InvalidMessage as exc:
            self._move_to_invalid(delivery, str(exc))
            return None
        except Exception as exc:
            self._move_to_invalid(delivery, undecodable(exc))
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
            self._broker.requeue(delivery, after_s=self._retry.delay_s(1))
            raise

    @staticmethod
    def _part_row(delivery: Delivery, inbound: Inbound, read_at: datetime) -> dict[str, Any] | None:
        """The store row of a sequence part (None for a whole message)."""
        if inbound.seq_id is None:
            return None
        assert inbound.seq_pos is not None and inbound.seq_size
        return sequence.part_row(
            delivery,
            seq_id=inbound.seq_id,
            position=inbound.seq_pos,
            size=inbound.seq_size,
            now=read_at,
        )

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
            reason = self._attempts.dead_letter_reason(
                tx.session, props.message_id, self._retry.max_attempts
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
                self._broker.ack(delivery)
            else:
                tx.taken_messages.append(TakenMessage(incoming, inbound, read_at, delivered=False))
            self._stats.delivered += 1
            return message_for(incoming, inbound, read_at)
        if tx is not None:
            return self._decisions.decide(tx.session, incoming, inbound, read_at, tx)
        with Session(self._engine) as session, session.begin():
            message = self._decisions.decide(session, incoming, inbound, read_at, None)
        self._broker.ack(delivery, deferred=True)  # the RLOG row drops a redelivery
        return message

    def _move_to_invalid(self, delivery: Delivery, reason: str) -> None:
        log.warning(
            "moving message %s from %r to %s: %s",
            delivery.properties.message_id,
            delivery.queue,
            self._invalid_queue,
            reason,
        )
        self._broker.move_to_invalid(delivery, reason)
        self._stats.invalid += 1
