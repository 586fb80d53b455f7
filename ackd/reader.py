"""The reading loops of a ``Receiver``: ``read`` polls a queue (and the store for complete
sequences) until a message is accepted or the timeout passes; ``consume`` hands each
accepted message of a broker consumer to the app's handler, one transaction each."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from sqlalchemy.orm import Session

from ackd.broker import Broker, Delivery
from ackd.incoming import PendingSequences, ReceiverTransaction
from ackd.intake import Intake
from ackd.message import Message
from ackd.reassembly import SequenceReassembly

log = logging.getLogger(__name__)

Handler = Callable[[Message, Session | None], None]

#: How often a reader looks for complete sequences in the store regardless (seconds).
STORE_RECHECK_S = 2.0


class Reader:
    """Takes the messages of one receiver, from the broker and from its store."""

    def __init__(
        self,
        *,
        broker: Broker,
        intake: Intake,
        sequences: SequenceReassembly,
        pending: PendingSequences,
        open_transaction: Callable[[], AbstractContextManager[ReceiverTransaction]],
        poll_interval_s: float,
    ) -> None:
        self._broker = broker
        self._intake = intake
        self._sequences = sequences
        self._pending = pending
        self._open_transaction = open_transaction
        self._poll_interval_s = poll_interval_s

    def next_message(
        self, queue: str, timeout: float, tx: ReceiverTransaction | None
    ) -> Message | None:
        """The next message of ``queue`` (within ``tx`` if given), or None on timeout."""
        deadline = time.monotonic() + timeout
        pending = self._pending
        while True:
            if tx is None:
                self._sequences.expire_incomplete()  # rate-limited; parts may be stored by anyone
            if time.monotonic() >= pending.next_recheck:
                # Safety net: other consumers' commits can complete a sequence too.
                pending.maybe_complete = True
                pending.next_recheck = time.monotonic() + STORE_RECHECK_S
            if pending.maybe_complete:
                message = self._sequences.deliver_complete(queue, tx)
                if message is not None:
                    return message
            delivery = self._broker.get(queue)
            if delivery is not None:
                message = self._intake.accept(delivery, tx)
                if message is not None:
                    return message
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            time.sleep(min(self._poll_interval_s, remaining))

    def consume(
        self,
        queue: str,
        handler: Handler,
        *,
        transactional: bool,
        prefetch: int,
        max_messages: int | None,
        idle_timeout_s: float | None,
        stop: threading.Event | None,
    ) -> int:
        """See ``Receiver.consume``."""
        handled = 0
        last = time.monotonic()
        stream = self._broker.consume(queue, prefetch=prefetch, inactivity_s=0.1)
        try:
            for delivery in stream:
                if stop is not None and stop.is_set():
                    break
                if delivery is None:
                    if self._pending.maybe_complete and self._handle_stored(
                        queue, handler, transactional
                    ):
                        handled += 1
                        last = time.monotonic()
                    elif idle_timeout_s is not None and self._idle_for(last) > idle_timeout_s:
                        break
                    continue
                if self._handle_delivery(delivery, handler, transactional):
                    handled += 1
                    last = time.monotonic()
                if max_messages is not None and handled >= max_messages:
                    break
        finally:
            stream.close()
        return handled

    def _idle_for(self, last_handled: float) -> float:
        """Seconds with nothing to do: a message held back for another attempt, or given
        back a moment ago, is work still to come."""
        if self._broker.held_back:
            return 0.0
        return time.monotonic() - max(last_handled, self._broker.last_release)

    def _handle_delivery(self, delivery: Delivery, handler: Handler, transactional: bool) -> bool:
        if not transactional:
            message = self._intake.accept(delivery, None)
            if message is not None:
                self._call_after_ack(handler, message)
            return message is not None
        try:
            with self._open_transaction() as tx:
                message = self._intake.accept(delivery, tx)
                if message is not None:
                    handler(message, tx.session)
        except Exception:
            log.exception("handler failed; the message was requeued")
            return False
        return message is not None

    def _handle_stored(self, queue: str, handler: Handler, transactional: bool) -> bool:
        if not transactional:
            message = self._sequences.deliver_complete(queue, None)
            if message is not None:
                self._call_after_ack(handler, message)
            return message is not None
        try:
            with self._open_transaction() as tx:
                message = self._sequences.deliver_complete(queue, tx)
                if message is not None:
                    handler(message, tx.session)
        except Exception:
            log.exception("handler failed on a reassembled sequence; it stays stored")
            return False
        return message is not None

    @staticmethod
    def _call_after_ack(handler: Handler, message: Message) -> None:
        try:
            handler(message, None)
        except Exception:
            # Non-transactional: the message was acked before the handler ran, as a
            # non-transactional get is; the failure is the app's to report.
            log.exception("handler failed on a non-transactional message")
