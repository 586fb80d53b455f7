"""``Receiver``: read conditional messages and acknowledge them automatically.

- ``read(queue)`` (non-transactional): the RLOG row and the READ ack's outbox row commit in
  one local transaction, then the AMQP message is acked, then the app gets it.
- ``transaction()``: the app's own SQLAlchemy session; ``tx.read(queue)`` takes a message
  unacked; the app's writes, the RLOG row and the COMMIT ack's outbox row commit together,
  and only then is the AMQP message acked. On an exception: rollback, the message is
  requeued after a pause that doubles with each failed attempt (``retry_backoff`` up to
  ``retry_backoff_max``), and after ``max_attempts`` failed attempts it goes to the
  invalid-message queue.
- ``consume(queue, handler)``: the same, event-driven, for competing consumers.

Plain (non-conditional) messages pass through the same API with no ack. Messages with
malformed condmsg headers, a bad token or an undecodable payload go to the invalid-message
queue with the reason in a header; the app never sees them. So does a message on which
judging it raised anything else (a codec bug): it costs that message, never the reader.
A failure of the receiver store or the broker is not the message's fault: it propagates,
and the message goes back to its queue.

Exactly once for a transactional app: an original or compensation is recorded by its
RLOG row, a success notice by its inbox row, each committed with the app's transaction;
a redelivery after a crash before the broker ack finds the row and is dropped. Plain
messages have no such row: like any AMQP consumer's, they are at least once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from ackd import fastpath, rlog, sequence
from ackd.attempts import (
    DEFAULT_BACKOFF,
    DEFAULT_BACKOFF_MAX,
    DEFAULT_MAX_ATTEMPTS,
    AttemptCounts,
    RetryPolicy,
    poison_key,
)
from ackd.broker import Broker, Delivery
from ackd.emit import commit_with_acks, enqueue_ack
from ackd.identity import checked_name, default_receiver_id
from ackd.inbound import (
    Inbound,
    InvalidMessage,
    check_message_id,
    check_payload,
    check_token,
    parse,
)
from ackd.message import Message
from ackd.tables import metadata, poison
from condmsg import protocol as p
from condmsg.acks import AckKind
from condmsg.db import make_engine
from condmsg.errors import ConfigError
from condmsg.relaying import OwnsOutbox
from condmsg.settings import Settings
from condmsg.timeutil import utcnow
from outbox.table import create_tables as create_outbox_tables

log = logging.getLogger(__name__)

Handler = Callable[[Message, Session | None], None]

#: PostgreSQL SQLSTATEs: a detected deadlock, a lock wait cut by ``lock_timeout``.
DEADLOCK_DETECTED = "40P01"
LOCK_NOT_AVAILABLE = "55P03"
#: How often a reader looks for complete sequences in the store regardless (seconds).
STORE_RECHECK_S = 2.0
#: How long a side transaction of a transactional read waits for an RLOG row.
LOCK_TIMEOUT_MS = 2000


@dataclass(slots=True)
class ReceiverStats:
    delivered: int = 0
    duplicates: int = 0
    discards: int = 0
    cancelled: int = 0
    invalid: int = 0
    rolled_back: int = 0
    parts: int = 0


@dataclass(slots=True)
class _Incoming:
    """A message ready for the RLOG decision: an AMQP delivery or an assembled sequence."""

    queue: str
    body: bytes
    content_type: str | None
    message_id: str | None
    headers: dict[str, Any]
    redelivered: bool
    delivery: Delivery | None


@dataclass(slots=True)
class _Taken:
    incoming: _Incoming
    inbound: Inbound
    read_at: datetime
    delivered: bool


@dataclass(slots=True)
class ReceiverTransaction:
    """One transactional read scope: ``session`` is the app's, ``read`` takes messages."""

    receiver: Receiver
    session: Session
    taken: list[_Taken] = field(default_factory=list)
    #: (CM, destination) rows this transaction delivered and therefore holds.
    held: set[tuple[str | None, str | None]] = field(default_factory=set)

    def read(self, queue: str, timeout: float = 5.0) -> Message | None:
        """The next message of ``queue`` within this transaction, or None on timeout."""
        return self.receiver._next(queue, timeout, self)


class Receiver(OwnsOutbox):
    """The receiving side for one final recipient identity (``recipient``).

    ``secret``, when given (or ``CONDMSG_SECRET``), makes the receiver verify each copy's
    token and reject forged copies; without it the evaluator still rejects their acks.

    A message whose transactional processing failed is held back before it comes back:
    ``retry_backoff`` (default 200 ms) after the first failure, doubling after each
    further one up to ``retry_backoff_max`` (default 5 s); after ``max_attempts`` failures
    (default 5, counted across redeliveries and receiver processes by message id) it goes
    to the invalid queue. The defaults ride out about 3 s of a failing database.
    """

    def __init__(
        self,
        *,
        amqp_url: str,
        db_url: str | None = None,
        recipient: str,
        engine: Engine | None = None,
        receiver_id: str | None = None,
        secret: bytes | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        retry_backoff: timedelta = DEFAULT_BACKOFF,
        retry_backoff_max: timedelta = DEFAULT_BACKOFF_MAX,
        sequence_timeout: timedelta = timedelta(minutes=5),
        poll_interval_s: float = 0.05,
        invalid_queue: str = p.INVALID_MESSAGE_QUEUE,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        if engine is None and db_url is None:
            raise ConfigError("Receiver needs db_url (CONDMSG_DB_URL) or an engine")
        self.recipient = checked_name(recipient, "recipient identity")
        self.receiver_id = checked_name(
            receiver_id or default_receiver_id(recipient), "receiver id"
        )
        self.amqp_url = amqp_url
        # No pre-ping: it would add a round trip to every transaction. A connection that
        # died is found on use instead; that transaction rolls back, its message is
        # requeued, and the pool replaces the connection.
        self.engine = (
            engine if engine is not None else make_engine(str(db_url), pool_pre_ping=False)
        )
        self._postgres = self.engine.dialect.name == "postgresql"
        if self._postgres:
            fastpath.watch(self.engine)
        self.secret = secret
        if max_attempts < 1:
            raise ConfigError("max_attempts must be at least 1")
        if retry_backoff < timedelta(0) or retry_backoff_max < retry_backoff:
            raise ConfigError("retry_backoff must be >= 0 and at most retry_backoff_max")
        self.max_attempts = max_attempts
        self.retry = RetryPolicy(max_attempts, retry_backoff, retry_backoff_max)
        self._attempts = AttemptCounts(self.engine)
        #: Reassembled sequences held back after a failed attempt: seq id -> monotonic due.
        self._sequences_due: dict[str, float] = {}
        self.sequence_timeout = sequence_timeout
        self.poll_interval_s = poll_interval_s
        self.stats = ReceiverStats()
        self._clock = clock
        self.invalid_queue = invalid_queue
        self._broker = Broker(
            amqp_url, name=f"condmsg-receiver-{recipient}", invalid_queue=invalid_queue
        )
        self._maybe_sequences = True
        self._next_store_check = 0.0
        self._next_expiry_check = 0.0
        self._held: Connection | None = None
        self._held_by: int | None = None
        metadata.create_all(self.engine)
        create_outbox_tables(self.engine)

    @classmethod
    def from_env(cls, *, recipient: str, **overrides: Any) -> Receiver:
        options = Settings.from_env().endpoint_options() | overrides
        return cls(recipient=recipient, **options)

    # -- public API -----------------------------------------------------------------

    def read(self, queue: str, timeout: float = 5.0) -> Message | None:
        """The next message of ``queue`` (non-transactional: READ ack), None on timeout."""
        return self._next(queue, timeout, None)

    @contextmanager
    def transaction(self) -> Iterator[ReceiverTransaction]:
        """Commits on a clean exit (then acks), rolls back and requeues on an exception."""
        session = Session(self._bind())
        session.begin()
        tx = ReceiverTransaction(self, session)
        try:
            yield tx
        except BaseException as exc:
            self._rollback(tx, exc)
            raise
        else:
            self._commit(tx)
        finally:
            session.close()

    def consume(
        self,
        queue: str,
        handler: Handler,
        *,
        transactional: bool = True,
        prefetch: int = 50,
        max_messages: int | None = None,
        idle_timeout_s: float | None = None,
        stop: threading.Event | None = None,
    ) -> int:
        """Handle messages of ``queue`` until ``stop`` is set, ``max_messages`` were handled
        or nothing came for ``idle_timeout_s``; returns how many the handler got.

        ``handler(message, session)`` gets the transaction's session when
        ``transactional`` (its writes commit with the COMMIT ack), else None. A handler
        exception rolls the transaction back and requeues the message after its backoff;
        consuming goes on meanwhile (nothing sleeps: the message is held unacked), and
        ``idle_timeout_s`` does not end it while a message waits for another attempt.
        """
        handled = 0
        last = time.monotonic()
        stream = self._broker.consume(queue, prefetch=prefetch, inactivity_s=0.1)
        try:
            for delivery in stream:
                if stop is not None and stop.is_set():
                    break
                if delivery is None:
                    if self._maybe_sequences and self._handle_stored(queue, handler, transactional):
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

    @property
    def _relay_name(self) -> str:
        return f"condmsg-receiver-relay-{self.recipient}"

    def close(self) -> None:
        self._broker.close()
        held, self._held = self._held, None
        if held is not None:
            with suppress(sa.exc.SQLAlchemyError):
                held.close()

    def _bind(self) -> Engine | Connection:
        """What the app's transactions run on: on PostgreSQL one connection this receiver
        keeps (for the thread that uses it), not a pool checkout and return per message.

        A connection that failed (SQLAlchemy invalidates it on a disconnect) is replaced
        at the next transaction.
        """
        if not self._postgres:
            return self.engine
        me = threading.get_ident()
        if self._held_by is not None and self._held_by != me:
            return self.engine  # another thread: the pool, as usual
        held = self._held
        if held is None or held.closed or held.invalidated:
            if held is not None:
                with suppress(sa.exc.SQLAlchemyError):
                    held.close()
            held = self._held = self.engine.connect()
            self._held_by = me
        return held

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- consuming helpers ------------------------------------------------------------

    def _handle_delivery(self, delivery: Delivery, handler: Handler, transactional: bool) -> bool:
        if not transactional:
            message = self._accept(delivery, None)
            if message is not None:
                self._call(handler, message, None)
            return message is not None
        try:
            with self.transaction() as tx:
                message = self._accept(delivery, tx)
                if message is not None:
                    handler(message, tx.session)
        except Exception:
            log.exception("handler failed; the message was requeued")
            return False
        return message is not None

    def _handle_stored(self, queue: str, handler: Handler, transactional: bool) -> bool:
        if not transactional:
            message = self._from_store(queue, None)
            if message is not None:
                self._call(handler, message, None)
            return message is not None
        try:
            with self.transaction() as tx:
                message = self._from_store(queue, tx)
                if message is not None:
                    handler(message, tx.session)
        except Exception:
            log.exception("handler failed on a reassembled sequence; it stays stored")
            return False
        return message is not None

    @staticmethod
    def _call(handler: Handler, message: Message, session: Session | None) -> None:
        try:
            handler(message, session)
        except Exception:
            # Non-transactional: the message was acked before the handler ran, as a
            # non-transactional get is; the failure is the app's to report.
            log.exception("handler failed on a non-transactional message")

    # -- the read pipeline ------------------------------------------------------------

    def _next(self, queue: str, timeout: float, tx: ReceiverTransaction | None) -> Message | None:
        deadline = time.monotonic() + timeout
        while True:
            if tx is None:
                self._expire_sequences()  # rate-limited; parts may be stored by anyone
            if time.monotonic() >= self._next_store_check:
                # Safety net: other consumers' commits can complete a sequence too.
                self._maybe_sequences = True
                self._next_store_check = time.monotonic() + STORE_RECHECK_S
            if self._maybe_sequences:
                message = self._from_store(queue, tx)
                if message is not None:
                    return message
            delivery = self._broker.get(queue)
            if delivery is not None:
                message = self._accept(delivery, tx)
                if message is not None:
                    return message
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            time.sleep(min(self.poll_interval_s, remaining))

    def _accept(self, delivery: Delivery, tx: ReceiverTransaction | None) -> Message | None:
        read_at = self._clock()
        props = delivery.properties
        try:
            inbound = parse(delivery.headers, props.reply_to)
            check_message_id(props.message_id, inbound)
            check_token(inbound, self.secret, delivery.body)
        except InvalidMessage as exc:
            self._invalid(delivery, str(exc))
            return None
        except Exception as exc:  # a codec's bug costs this message, never the reader
            self._invalid(delivery, undecodable(exc))
            return None
        try:
            part = self._part_row(delivery, inbound, read_at)
            if part is None:
                check_payload(delivery.body, props.content_type)
        except InvalidMessage as exc:
            self._invalid(delivery, str(exc))
            return None
        except Exception as exc:
            self._invalid(delivery, undecodable(exc))
            return None
        try:
            if part is not None:
                self._store_part(delivery, inbound, part, tx)
                return None
            return self._take(delivery, inbound, read_at, tx)
        except BaseException:
            # The store or the broker failed, not the message: it goes back to its queue
            # (uncounted), after a pause so that a caller retrying at once does not spin
            # on it while the store is down. Settling twice is harmless (see Broker).
            self._broker.requeue(delivery, after_s=self.retry.delay_s(1))
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

    def _take(
        self,
        delivery: Delivery,
        inbound: Inbound,
        read_at: datetime,
        tx: ReceiverTransaction | None,
    ) -> Message | None:
        """Deliver a judged message (or drop it by the RLOG's decision)."""
        props = delivery.properties
        # Attempts are counted only when a rollback requeues, so a first delivery has none:
        # skip the lookup (a database round trip per message).
        if tx is not None and delivery.redelivered and props.message_id:
            reason = self._exhausted(tx.session, props.message_id)
            if reason is not None:
                self._invalid(delivery, reason)
                return None
        incoming = _Incoming(
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
                tx.taken.append(_Taken(incoming, inbound, read_at, delivered=False))
            self.stats.delivered += 1
            return self._message(incoming, inbound, read_at)
        if tx is not None:
            return self._decide(tx.session, incoming, inbound, read_at, tx)
        with Session(self.engine) as session, session.begin():
            message = self._decide(session, incoming, inbound, read_at, None)
        self._broker.ack(delivery, deferred=True)  # the RLOG row drops a redelivery
        return message

    def _decide(
        self,
        session: Session,
        incoming: _Incoming,
        inbound: Inbound,
        read_at: datetime,
        tx: ReceiverTransaction | None,
    ) -> Message | None:
        """The RLOG decision, in ``session``; for a non-transactional read also the ack."""
        if tx is None:
            decision = self._rlog_decision(session, incoming, inbound, read_at, False)
        else:
            found = self._decide_in_transaction(tx, incoming, inbound, read_at)
            if found is None:
                return None
            decision = found
        self._count(decision, inbound)
        if decision is not rlog.Decision.DELIVER:
            return None
        return self._message(incoming, inbound, read_at)

    def _decide_in_transaction(
        self, tx: ReceiverTransaction, incoming: _Incoming, inbound: Inbound, read_at: datetime
    ) -> rlog.Decision | None:
        """The RLOG decision of a transactional read; None if the message was requeued.

        A delivered message's RLOG row commits with the app's transaction. A message that is
        not delivered (duplicate, discard, cancel-out) must not keep its row locked until
        the app commits: two competing consumers would each hold rows the other needs and
        deadlock again and again. On PostgreSQL its decision is therefore tried in a
        SAVEPOINT, rolled back (which releases the row) and redone in a short transaction
        of its own. SQLite has one writer at a time, so there it simply stays in the app's
        transaction.
        """
        session = tx.session
        key = (inbound.cm_id, inbound.destination)
        if not self._postgres:
            decision = self._rlog_decision(session, incoming, inbound, read_at, True)
            return self._took(tx, incoming, inbound, read_at, decision)
        if inbound.kind is p.MessageKind.ORIGINAL and not tx.held:
            # The common case, without a SAVEPOINT: the insert either claims the row (and
            # this transaction keeps it) or conflicts, which writes and locks nothing.
            # Holding no RLOG row yet, this transaction cannot be part of a lock cycle
            # through the RLOG.
            if rlog.claim_original(
                session,
                inbound,
                message_id=incoming.message_id,
                recipient=self.recipient,
                receiver=self.receiver_id,
                read_at=read_at,
                transactional=True,
            ):
                return self._took(tx, incoming, inbound, read_at, rlog.Decision.DELIVER)
            return self._decide_apart(incoming, inbound, read_at)
        nested = session.begin_nested()
        try:
            decision = self._rlog_decision(session, incoming, inbound, read_at, True)
        except sa.exc.OperationalError as exc:
            nested.rollback()
            if getattr(exc.orig, "sqlstate", None) != DEADLOCK_DETECTED:
                raise
            # PostgreSQL broke a lock cycle by failing this statement: requeue and go on.
            log.info("deadlock on cm %s; requeued, the transaction goes on", inbound.cm_id)
            self._give_back(incoming)
            return None
        if decision is rlog.Decision.DELIVER or key in tx.held:
            nested.commit()
            return self._took(tx, incoming, inbound, read_at, decision)
        nested.rollback()
        return self._decide_apart(incoming, inbound, read_at)

    @staticmethod
    def _took(
        tx: ReceiverTransaction,
        incoming: _Incoming,
        inbound: Inbound,
        read_at: datetime,
        decision: rlog.Decision,
    ) -> rlog.Decision:
        """Note a decision taken inside the app's transaction (settled at its end)."""
        delivered = decision is rlog.Decision.DELIVER
        if delivered:
            tx.held.add((inbound.cm_id, inbound.destination))
        tx.taken.append(_Taken(incoming, inbound, read_at, delivered=delivered))
        return decision

    def _decide_apart(
        self, incoming: _Incoming, inbound: Inbound, read_at: datetime
    ) -> rlog.Decision | None:
        """Record a non-delivering decision in its own transaction, then ack the message.

        If the facts changed meanwhile and the message would now be delivered, it is
        requeued instead (a transactional read must deliver within the app's transaction).
        The lock timeout breaks a wait that PostgreSQL cannot see: this thread's own app
        transaction may hold the row another consumer is waiting behind.
        """
        try:
            with Session(self.engine) as apart, apart.begin():
                apart.execute(sa.text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT_MS}ms'"))
                decision = self._rlog_decision(apart, incoming, inbound, read_at, True)
                if decision is rlog.Decision.DELIVER:
                    apart.rollback()
                    self._give_back(incoming)
                    return None
        except sa.exc.OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) not in (DEADLOCK_DETECTED, LOCK_NOT_AVAILABLE):
                raise
            self._give_back(incoming)
            return None
        if incoming.delivery is not None:
            self._broker.ack(incoming.delivery, deferred=True)
        return decision

    def _give_back(self, incoming: _Incoming) -> None:
        if incoming.delivery is not None:
            self._broker.requeue(incoming.delivery)
        else:
            self._maybe_sequences = True  # a reassembled sequence stays in the store

    def _rlog_decision(
        self,
        session: Session,
        incoming: _Incoming,
        inbound: Inbound,
        read_at: datetime,
        transactional: bool,
    ) -> rlog.Decision:
        if inbound.kind is p.MessageKind.COMPENSATION:
            return rlog.on_compensation(session, inbound, receiver=self.receiver_id, now=read_at)
        if inbound.kind is p.MessageKind.SUCCESS:
            return rlog.on_success(session, inbound, now=read_at)
        decision = rlog.on_original(
            session,
            inbound,
            message_id=incoming.message_id,
            recipient=self.recipient,
            receiver=self.receiver_id,
            read_at=read_at,
            transactional=transactional,
        )
        if decision is rlog.Decision.DELIVER and not transactional:
            enqueue_ack(
                session,
                inbound,
                kind=AckKind.READ,
                read_at=read_at,
                committed_at=None,
                recipient=self.recipient,
                receiver=self.receiver_id,
            )
        return decision

    def _count(self, decision: rlog.Decision, inbound: Inbound) -> None:
        if decision is rlog.Decision.DELIVER:
            self.stats.delivered += 1
        elif decision is rlog.Decision.DUPLICATE:
            self.stats.duplicates += 1
        elif decision is rlog.Decision.DISCARD:
            self.stats.discards += 1
            log.info(
                "discarded cm %s at %s: compensated before it was read",
                inbound.cm_id,
                inbound.destination,
            )
        else:
            self.stats.cancelled += 1

    @staticmethod
    def _message(incoming: _Incoming, inbound: Inbound, read_at: datetime) -> Message:
        return Message(
            queue=incoming.queue,
            body=incoming.body,
            kind=inbound.kind,
            cm_id=inbound.cm_id,
            destination=inbound.destination,
            sender=inbound.sender,
            message_id=incoming.message_id,
            content_type=incoming.content_type,
            headers=incoming.headers,
            read_at=read_at,
            redelivered=incoming.redelivered,
        )

    def _invalid(self, delivery: Delivery, reason: str) -> None:
        log.warning(
            "moving message %s from %r to %s: %s",
            delivery.properties.message_id,
            delivery.queue,
            self.invalid_queue,
            reason,
        )
        self._broker.move_to_invalid(delivery, reason)
        self.stats.invalid += 1

    # -- commit and rollback ------------------------------------------------------------

    def _commit(self, tx: ReceiverTransaction) -> None:
        try:
            commit_with_acks(
                tx.session,
                [
                    (taken.inbound, taken.read_at)
                    for taken in tx.taken
                    if taken.delivered and taken.inbound.kind is p.MessageKind.ORIGINAL
                ],
                committed_at=self._clock(),
                recipient=self.recipient,
                receiver=self.receiver_id,
            )
            if any(t.inbound.seq_id is not None for t in tx.taken):
                # Parts stored by this transaction are visible now: the sequence may be
                # complete (another consumer's check may have run before this commit).
                self._maybe_sequences = True
        except BaseException as exc:
            self._rollback(tx, exc)
            raise
        # Only now: a crash before these acks makes RabbitMQ redeliver, and the RLOG row (a
        # success notice's inbox row) committed above drops the redelivery (the app never
        # sees a copy, compensation or notice twice). That is also why the acks of
        # conditional messages may be deferred and batched; plain messages and sequence
        # parts have no such row and are acked at once.
        for taken in tx.taken:
            if taken.incoming.delivery is not None:
                rlog_backed = taken.inbound.kind is not None and taken.inbound.seq_id is None
                self._broker.ack(taken.incoming.delivery, deferred=rlog_backed)

    def _rollback(self, tx: ReceiverTransaction, exc: BaseException) -> None:
        tx.session.rollback()
        self.stats.rolled_back += 1
        # The messages the app had: delivered originals and plain messages (a plain one is
        # taken with ``delivered`` False, as it holds no RLOG row, but the app had it too).
        # Each failure counts as one attempt of each, and holds it back for its backoff.
        failed = [t for t in tx.taken if t.delivered or t.inbound.kind is None]
        keys = [poison_key(t.incoming.message_id) for t in failed if t.incoming.message_id]
        totals = self._attempts.record(keys, repr(exc)[:500], self._clock()) if keys else {}
        for taken in tx.taken:
            delay = 0.0
            if any(taken is t for t in failed):
                message_id = taken.incoming.message_id
                # An id-less message cannot be counted; it still waits the first pause.
                attempts = totals[poison_key(message_id)] if message_id else 1
                delay = self.retry.delay_s(attempts)
            if taken.incoming.delivery is not None:
                self._broker.requeue(taken.incoming.delivery, after_s=delay)
            else:
                self._maybe_sequences = True  # a reassembled sequence is back in the store
                if delay > 0 and taken.incoming.message_id:
                    due = time.monotonic() + delay
                    self._sequences_due[str(taken.incoming.message_id)] = due

    def _exhausted(self, session: Session, message_id: str | bytes) -> str | None:
        """The dead-letter reason of a message whose processing failed ``max_attempts``
        times (its count is then cleared), or None.

        Runs in the transaction's own session: on SQLite a second connection would wait for
        the write lock this transaction holds.
        """
        key = poison_key(message_id)
        row = session.execute(
            sa.select(poison.c.attempts, poison.c.last_error).where(poison.c.message_id == key)
        ).first()
        unsaved = self._attempts.unsaved(key)
        attempts = (row.attempts if row is not None else 0) + (unsaved.attempts if unsaved else 0)
        if attempts < self.max_attempts:
            return None
        if row is not None:
            session.execute(sa.delete(poison).where(poison.c.message_id == key))
        self._attempts.forget(key)
        last_error = unsaved.error if unsaved else row.last_error if row is not None else None
        return f"poison message: processing failed {attempts} times: {last_error}"

    # -- message sequences --------------------------------------------------------------

    def _store_part(
        self,
        delivery: Delivery,
        inbound: Inbound,
        part: dict[str, Any],
        tx: ReceiverTransaction | None,
    ) -> None:
        """Keep a part in the store. Inside a transaction it is stored (and acked) with the
        transaction, so a rollback requeues it; otherwise at once."""
        if tx is not None:
            sequence.store_part(tx.session, part)
            incoming = _Incoming(
                delivery.queue, b"", None, None, delivery.headers, delivery.redelivered, delivery
            )
            tx.taken.append(_Taken(incoming, inbound, part["received_at"], delivered=False))
        else:
            with Session(self.engine) as session, session.begin():
                sequence.store_part(session, part)
            self._broker.ack(delivery)
        self.stats.parts += 1
        self._maybe_sequences = True

    def _from_store(self, queue: str, tx: ReceiverTransaction | None) -> Message | None:
        """Deliver a complete sequence of ``queue`` from the store, if there is one."""
        if tx is not None:
            return self._take_sequence(tx.session, queue, tx)
        with Session(self.engine) as session, session.begin():
            return self._take_sequence(session, queue, None)

    def _take_sequence(
        self, session: Session, queue: str, tx: ReceiverTransaction | None
    ) -> Message | None:
        ids = sequence.complete_ids(session, queue)
        if not ids:
            self._maybe_sequences = False
            return None
        for seq_id in ids:
            if self._held_back(seq_id):
                continue
            assembled = sequence.take(session, seq_id)
            if assembled is None:
                continue
            read_at = self._clock()
            judged = self._judge_sequence(assembled)
            if judged is None:
                continue
            inbound, headers, properties = judged
            if tx is not None and (reason := self._exhausted(session, seq_id)) is not None:
                self._broker.publish_invalid(assembled.body, headers, reason)
                self.stats.invalid += 1
                continue
            incoming = _Incoming(
                queue=queue,
                body=assembled.body,
                content_type=properties.get("content_type"),
                message_id=seq_id,
                headers=headers,
                redelivered=False,
                delivery=None,
            )
            message = self._decide(session, incoming, inbound, read_at, tx)
            if message is not None:
                return message
        return None

    def _held_back(self, seq_id: str) -> bool:
        due = self._sequences_due.get(seq_id)
        if due is None:
            return False
        if time.monotonic() < due:
            return True
        del self._sequences_due[seq_id]
        return False

    def _judge_sequence(
        self, assembled: sequence.Assembled
    ) -> tuple[Inbound, dict[str, Any], dict[str, Any]] | None:
        """The condmsg facts of a taken sequence, or None after moving it to the invalid
        queue (its parts' deletion commits with the caller's transaction)."""
        headers: dict[str, Any] = {}
        try:
            headers, properties = sequence.metadata_of(assembled)
            inbound = parse(headers, properties.get("reply_to"))
            # Parts carry their copy's token: the whole is judged as the original it is.
            check_token(inbound, self.secret, assembled.body)
            check_payload(assembled.body, properties.get("content_type"))
        except Exception as exc:  # a codec's bug costs this sequence, never the reader
            reason = str(exc) if isinstance(exc, InvalidMessage) else undecodable(exc)
            log.warning(
                "moving sequence %s to %s: %s", assembled.seq_id, self.invalid_queue, reason
            )
            self._broker.publish_invalid(assembled.body, headers, reason)
            self.stats.invalid += 1
            return None
        return inbound, headers, properties

    def _expire_sequences(self) -> None:
        now_mono = time.monotonic()
        if now_mono < self._next_expiry_check:
            return
        self._next_expiry_check = now_mono + max(1.0, self.sequence_timeout.total_seconds() / 4)
        cutoff = self._clock() - self.sequence_timeout
        with Session(self.engine) as session, session.begin():
            expired = sequence.take_expired(session, cutoff)
            by_seq: dict[str, list[tuple[int, int]]] = {}
            for seq_id, position, size, body, headers in expired:
                by_seq.setdefault(seq_id, []).append((position, size))
                reason = (
                    f"incomplete sequence {seq_id}: part {position + 1} of {size}, "
                    f"others missing after {self.sequence_timeout}"
                )
                # Published before the deleting transaction commits: a crash in between
                # duplicates parts on the invalid queue, it never loses them.
                self._broker.publish_invalid(body, headers, reason)
            for seq_id, seen in by_seq.items():
                log.warning(
                    "sequence %s incomplete (%d of %d parts); moved to %s",
                    seq_id,
                    len(seen),
                    seen[0][1],
                    self.invalid_queue,
                )
                self.stats.invalid += 1


def undecodable(exc: BaseException) -> str:
    """The invalid-queue reason for an unexpected exception while judging a message."""
    try:
        detail = str(exc)
    except Exception:  # an exception whose message itself fails
        detail = "?"
    return f"undecodable: {type(exc).__name__}: {detail}"
