"""The reading loops of a ``Receiver``: ``read`` polls a queue (and the store for complete
sequences) until a message is accepted or the timeout passes; ``consume`` hands each
accepted message of a broker consumer to the app's handler, one transaction each."""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import pika.exceptions
from sqlalchemy.orm import Session

from ackd.acceptance import Acceptance
from ackd.broker import Delivery
from ackd.context import ReceiveContext
from ackd.message import Message
from ackd.outage import StoreUnavailable
from ackd.sequences import SequenceReassembly
from ackd.transaction import ReceiverTransaction
from condmsg.core.errors import BrokerAuthError, BrokerError
from condmsg.infra.repeated_failures import reason_of
from condmsg.runtime.pausing import Pause

log = logging.getLogger(__name__)

Handler = Callable[[Message, Session | None], None]

#: How often a reader looks for complete sequences in the store regardless (seconds).
STORE_RECHECK_S = 2.0


class Reader:
    """Takes the messages of one receiver, from the broker and from its store."""

    def __init__(
        self,
        context: ReceiveContext,
        acceptance: Acceptance,
        sequences: SequenceReassembly,
        *,
        open_transaction: Callable[[], AbstractContextManager[ReceiverTransaction]],
        probe_store: Callable[[], None],
    ) -> None:
        self._ctx = context
        self._acceptance = acceptance
        self._sequences = sequences
        self._open_transaction = open_transaction
        self._probe_store = probe_store

    def next_message(
        self, queue: str, timeout: float, tx: ReceiverTransaction | None
    ) -> Message | None:
        """The next message of ``queue`` (within ``tx`` if given), or None on timeout."""
        deadline = time.monotonic() + timeout
        pending = self._ctx.pending
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
            delivery = self._ctx.broker.get(queue)
            if delivery is not None:
                message = self._acceptance.accept(delivery, tx)
                if message is not None:
                    return message
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            time.sleep(min(self._ctx.config.poll_interval_s, remaining))

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
        """See ``Receiver.consume``.

        An outage of the store or of RabbitMQ ends the broker consumer (what it held goes
        back to the queue), waits until the one that failed answers again, and starts a
        new consumer; the time it lasts is not idle time.
        """
        run = _Run(queue, handler, transactional, max_messages, idle_timeout_s, stop)
        activity = f"consuming {queue!r}"
        store = Pause(log, activity, "the receiver store", idle=self._ctx.broker.idle, stop=stop)
        broker = Pause(log, activity, "RabbitMQ", stop=stop)
        while not run.stopped():
            try:
                if self._consume_stream(run, prefetch, broker.ended):
                    break
            except StoreUnavailable as exc:
                store.failed(exc)
                if not store.until(self._probe_store):
                    break
            except BrokerAuthError:
                raise  # a wrong user or vhost: waiting does not mend it
            except (BrokerError, pika.exceptions.AMQPError, OSError) as exc:
                self._ctx.broker.close()  # RabbitMQ requeues what the channel held
                broker.failed(exc)
                if not broker.wait():
                    break
            run.last = time.monotonic()
        return run.handled

    def _consume_stream(
        self, run: _Run[Handler], prefetch: int, working: Callable[[], None]
    ) -> bool:
        """Consume with one broker consumer until done (True) or an outage (raised);
        ``working()`` once the consumer runs (an outage before it is over)."""
        stream = self._ctx.broker.consume(run.queue, prefetch=prefetch, inactivity_s=0.1)
        started = False
        try:
            for delivery in stream:
                if not started:
                    started = True
                    working()
                self._sequences.expire_incomplete()  # rate-limited; parts may be stored by anyone
                step = self.next_step(run, delivery)
                if step is Step.DONE:
                    return True
                if step is Step.TAKE and self._handle(run, delivery):
                    run.took_one()
                    if run.stopped():
                        return True  # without waiting for the consumer's next delivery
        finally:
            stream.close()
        return True

    def next_step(self, run: _Run[H], delivery: Delivery | None) -> Step:
        """What a consume loop does next with what its broker consumer gave it (None:
        nothing for a moment): take a message (the delivery, or a complete sequence from
        the store), wait for more, or end (``max_messages`` handled, or idle too long)."""
        if run.stopped():
            return Step.DONE
        if delivery is not None or self._ctx.pending.maybe_complete:
            return Step.TAKE
        if run.idle_timeout_s is not None and self._idle_for(run.last) > run.idle_timeout_s:
            return Step.DONE
        return Step.WAIT

    def expiry_due(self) -> bool:
        """Whether :meth:`~ackd.sequences.SequenceReassembly.expire_incomplete` would look
        at the store now (the async consumer spares the greenlet switch when not)."""
        return self._sequences.expiry_due()

    def expire_incomplete(self) -> None:
        self._sequences.expire_incomplete()

    def take(
        self, queue: str, delivery: Delivery | None, tx: ReceiverTransaction | None
    ) -> Message | None:
        """Judge and decide ``delivery`` (None: the store's next complete sequence of
        ``queue``) within ``tx``: the message for the app, or None (nothing for it)."""
        if delivery is None:
            return self._sequences.deliver_complete(queue, tx)
        return self._acceptance.accept(delivery, tx)

    def _idle_for(self, last_handled: float) -> float:
        """Seconds with nothing to do: a message held back for another attempt, or given
        back a moment ago, is work still to come."""
        if self._ctx.broker.held_back:
            return 0.0
        return time.monotonic() - max(last_handled, self._ctx.broker.last_release)

    def _handle(self, run: _Run[Handler], delivery: Delivery | None) -> bool:
        """Hand the delivery (None: a complete sequence from the store) to the handler;
        whether the handler got a message."""
        if not run.transactional:
            try:
                message = self.take(run.queue, delivery, None)
            except Exception as exc:
                self.raise_if_store_lost(exc, delivery)
                raise
            if message is not None:
                self._call_after_ack(run.handler, message)
            return message is not None
        try:
            with self._open_transaction() as tx:
                message = self.take(run.queue, delivery, tx)
                if message is not None:
                    run.handler(message, tx.session)
        except Exception as exc:
            self.raise_if_store_lost(exc, delivery)
            if isinstance(exc, BrokerError | pika.exceptions.AMQPError):
                raise  # the broker failed, not the message: consuming pauses and reconnects
            log_failed(delivery)
            return False
        return message is not None

    def raise_if_store_lost(self, exc: Exception, delivery: Delivery | None) -> None:
        """Raise :class:`StoreUnavailable` if ``exc`` came from an outage of the store,
        after giving ``delivery`` back uncounted (settling it twice is harmless: one that
        a rollback gave back already is not in the broker's books any more)."""
        if not self._ctx.store_lost(exc):
            return
        if delivery is not None:
            self._ctx.broker.requeue(delivery)
        if isinstance(exc, StoreUnavailable):
            raise exc
        raise StoreUnavailable(reason_of(exc)) from exc

    @staticmethod
    def _call_after_ack(handler: Handler, message: Message) -> None:
        try:
            handler(message, None)
        except Exception:
            log_handler_failed()


def log_failed(delivery: Delivery | None) -> None:
    """Log the exception in hand: the app's processing of ``delivery`` (None: of a
    complete sequence from the store) failed, and its transaction rolled back."""
    if delivery is None:
        log.exception("processing a reassembled sequence failed; it stays stored")
    else:
        log.exception(
            "processing message %s from %r failed; it is tried again after its backoff",
            delivery.properties.message_id,
            delivery.queue,
        )


def log_handler_failed() -> None:
    # Non-transactional: the message was acked before the handler ran, as a
    # non-transactional get is; the failure is the app's to report.
    log.exception("handler failed on a non-transactional message")


class Step(enum.Enum):
    """What a consume loop does next (:meth:`Reader.next_step`)."""

    TAKE = "take"
    WAIT = "wait"
    DONE = "done"


class StopFlag(Protocol):
    """What ends a consume: a ``threading.Event``, or an ``asyncio.Event`` for the async
    receiver's (:mod:`ackd.async_consume`)."""

    def is_set(self) -> bool: ...


H = TypeVar("H")


@dataclass(slots=True)
class _Run(Generic[H]):
    """One ``consume()`` call: what it hands the handler (``H``: the sync receiver's
    :data:`Handler`, or the async one's), when it ends, and its progress (kept across the
    broker consumers an outage makes it start anew)."""

    queue: str
    handler: H
    transactional: bool
    max_messages: int | None
    idle_timeout_s: float | None
    stop: StopFlag | None
    handled: int = 0
    #: When the handler last got a message (``time.monotonic()``).
    last: float = field(default_factory=time.monotonic)

    def stopped(self) -> bool:
        if self.stop is not None and self.stop.is_set():
            return True
        return self.max_messages is not None and self.handled >= self.max_messages

    def took_one(self) -> None:
        self.handled += 1
        self.last = time.monotonic()
