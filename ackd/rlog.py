"""The receiver log (RLOG) decisions: deliver, drop as duplicate, or cancel out.

The functions ``on_original``, ``on_compensation`` and ``on_success`` take the decision
on one message in a given session; :class:`RlogDecisions` decides where that session is
(the app's transaction, a SAVEPOINT in it, or a short transaction of its own), writes a
non-transactional read's READ ack and counts the decision.

RabbitMQ cannot delete an unread message from a queue, so cancel-out happens here. The row
for (CM, destination) is unique and holds ``consumed`` or ``cancelled``; whichever of the
original and its compensation inserts it first decides, and every interleaving of
concurrent consumers ends in exactly one of: the app got the original and then the
compensation, or the app got neither.

Concurrency: the insert is the store's claim (:class:`ackd.receiver_store.ReceiverStore`),
an ``INSERT ... ON CONFLICT DO NOTHING``. On PostgreSQL a second transaction inserting the
same key waits for the first to end (the unique index holds the in-progress row), then
either conflicts (the first committed) or inserts (it rolled back): exactly the
serialisation cancel-out needs, even when the original is read inside a long application
transaction. The follow-up ``SELECT ... FOR UPDATE`` locks the row so two
compensations cannot both be delivered. On SQLite every write transaction is serialised
(``BEGIN IMMEDIATE``), which gives the same outcome.

A success notice is recorded in the inbox (``condmsg_rx_inbox``) by the same kind of insert,
so that it too reaches a transactional app once, without writing an RLOG row that would
make its unconsumed original look consumed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from ackd.broker import Disposal, Fate
from ackd.context import ReceiveContext
from ackd.emit import enqueue_ack
from ackd.message import Message
from ackd.receiver_store import ReceiverStore
from ackd.tables import RlogState, rlog, rx_inbox
from ackd.transaction import Incoming, ReceiverTransaction, TakenMessage
from ackd.validation import Inbound
from condmsg.core.acks import AckKind
from condmsg.core.protocol import MessageKind

log = logging.getLogger(__name__)

#: PostgreSQL SQLSTATEs: a detected deadlock, a lock wait cut by ``lock_timeout``.
DEADLOCK_DETECTED = "40P01"
LOCK_NOT_AVAILABLE = "55P03"
#: How long a side transaction of a transactional read waits for an RLOG row.
LOCK_TIMEOUT_MS = 2000


class Decision(Enum):
    DELIVER = "deliver"  # hand it to the application
    DUPLICATE = "duplicate"  # seen before (redelivery after a commit): drop silently
    DISCARD = "discard"  # an original whose compensation came first: drop, report
    CANCELLED = "cancelled"  # a compensation for an unconsumed CM: drop, cancel the original


def _locked_row(session: Session, cm_id: str, destination: str, *columns: Any) -> sa.Result[Any]:
    """The row of (CM, destination) (``columns``, or all), locked until the transaction
    ends: a second compensation waits here for the first one's decision. SQLAlchemy writes
    no ``FOR UPDATE`` on SQLite, whose write transactions run one at a time."""
    query = (
        sa.select(*(columns or (rlog,)))
        .where(rlog.c.cm_id == cm_id, rlog.c.destination == destination)
        .with_for_update()
    )
    return session.execute(query)


def _key(inbound: Inbound) -> tuple[str, str]:
    assert inbound.cm_id is not None and inbound.destination is not None
    return inbound.cm_id, inbound.destination


@dataclass(frozen=True, slots=True)
class Reading:
    """Who read an original, when and how: what its ``consumed`` row records."""

    message_id: str | None
    recipient: str
    receiver: str
    read_at: datetime
    transactional: bool


def claim_original(
    store: ReceiverStore, session: Session, inbound: Inbound, reading: Reading
) -> bool:
    """The first step of :func:`on_original`: insert the ``consumed`` row. True means the
    original is delivered (and this transaction holds the row); False means a row exists
    and nothing was written or locked (:func:`on_original` decides what it means)."""
    cm_id, destination = _key(inbound)
    values = {
        "cm_id": cm_id,
        "destination": destination,
        "state": RlogState.CONSUMED.value,
        "message_id": reading.message_id,
        "recipient": reading.recipient,
        "receiver": reading.receiver,
        "sender": inbound.sender,
        "read_at": reading.read_at,
        "transactional": reading.transactional,
        "updated_at": reading.read_at,
    }
    return store.claim_original(session, values)


def on_original(
    store: ReceiverStore, session: Session, inbound: Inbound, reading: Reading
) -> Decision:
    if claim_original(store, session, inbound, reading):
        return Decision.DELIVER
    cm_id, destination = _key(inbound)
    row = _locked_row(session, cm_id, destination).one()
    if row.state == RlogState.CONSUMED.value:
        return Decision.DUPLICATE
    if row.discarded_at is None:
        _update(
            session,
            cm_id,
            destination,
            discarded_at=reading.read_at,
            message_id=reading.message_id,
        )
    return Decision.DISCARD


def on_compensation(
    store: ReceiverStore, session: Session, inbound: Inbound, *, receiver: str, now: datetime
) -> Decision:
    cm_id, destination = _key(inbound)
    inserted = store.claim(
        session,
        rlog,
        {
            "cm_id": cm_id,
            "destination": destination,
            "state": RlogState.CANCELLED.value,
            "receiver": receiver,
            "sender": inbound.sender,
            "compensated_at": now,
            "updated_at": now,
        },
    )
    if inserted:
        return Decision.CANCELLED
    row = _locked_row(session, cm_id, destination).one()
    if row.state == RlogState.CONSUMED.value and row.compensated_at is None:
        _update(session, cm_id, destination, compensated_at=now)
        return Decision.DELIVER
    return Decision.DUPLICATE


def on_success(
    store: ReceiverStore, session: Session, inbound: Inbound, *, now: datetime
) -> Decision:
    """A success notice is delivered once, whether or not the original was consumed here.

    The inbox row, written in the delivering transaction, is what drops a redelivery (a
    crash between the app's commit and the broker ack); the RLOG is not written where the
    original was not consumed, so that original stays deliverable. Where it was, its row
    notes the notice too (a noted row also means delivered).
    """
    cm_id, destination = _key(inbound)
    first_time = store.claim(
        session,
        rx_inbox,
        {
            "cm_id": cm_id,
            "destination": destination,
            "kind": MessageKind.SUCCESS.value,
            "delivered_at": now,
        },
    )
    if not first_time:
        return Decision.DUPLICATE
    found = _locked_row(session, cm_id, destination, rlog.c.success_at).first()
    if found is None:
        return Decision.DELIVER
    if found.success_at is not None:
        return Decision.DUPLICATE
    _update(session, cm_id, destination, success_at=now)
    return Decision.DELIVER


def _update(session: Session, cm_id: str, destination: str, **values: Any) -> None:
    values.setdefault("updated_at", next(iter(v for v in values.values() if v is not None)))
    session.execute(
        sa.update(rlog)
        .where(rlog.c.cm_id == cm_id, rlog.c.destination == destination)
        .values(**values)
    )


class RlogDecisions:
    """Takes the RLOG decisions of one receiver and counts them in its ``stats``.

    Where the store locks rows (``row_locks``), a decision that delivers nothing leaves
    the app's transaction.
    """

    def __init__(self, context: ReceiveContext) -> None:
        self._ctx = context

    def decide(
        self,
        session: Session,
        incoming: Incoming,
        inbound: Inbound,
        read_at: datetime,
        tx: ReceiverTransaction | None,
    ) -> tuple[Message | None, Disposal]:
        """The RLOG decision, in ``session`` (for a non-transactional read with its READ
        ack): the message the app gets, or None, and what becomes of the delivery at the
        broker once ``session`` has committed (a reassembled sequence has none to settle)."""
        if tx is None:
            decision = self.rlog_decision(session, incoming, inbound, read_at, False)
            disposal = Disposal(Fate.ACK_DEFERRED)  # the RLOG row drops a redelivery
        else:
            found, disposal = self._decide_in_transaction(tx, incoming, inbound, read_at)
            if found is None:
                return None, disposal
            decision = found
        self._count_decision(decision, inbound)
        if decision is not Decision.DELIVER:
            return None, disposal
        return incoming.message(inbound, read_at), disposal

    def _decide_in_transaction(
        self, tx: ReceiverTransaction, incoming: Incoming, inbound: Inbound, read_at: datetime
    ) -> tuple[Decision | None, Disposal]:
        """The RLOG decision of a transactional read (None if the message is put back),
        and what becomes of its delivery.

        A delivered message's RLOG row commits with the app's transaction. A message that is
        not delivered (duplicate, discard, cancel-out) must not keep its row locked until
        the app commits: two competing consumers would each hold rows the other needs and
        deadlock again and again. Where rows are locked (PostgreSQL) its decision is
        therefore tried in a SAVEPOINT, rolled back (which releases the row) and redone in
        a short transaction of its own. Where one writer runs at a time (SQLite) it simply
        stays in the app's transaction.
        """
        session = tx.session
        rlog_row = (inbound.cm_id, inbound.destination)
        if not self._ctx.row_locks:
            decision = self.rlog_decision(session, incoming, inbound, read_at, True)
            return self._keep_in_transaction(tx, incoming, inbound, read_at, decision)
        if inbound.kind is MessageKind.ORIGINAL and not tx.locked_rlog_rows:
            # The common case, without a SAVEPOINT: the insert either claims the row (and
            # this transaction keeps it) or conflicts, which writes and locks nothing.
            # Holding no RLOG row yet, this transaction cannot be part of a lock cycle
            # through the RLOG.
            reading = self._reading(incoming, read_at, transactional=True)
            if claim_original(self._ctx.store, session, inbound, reading):
                return self._keep_in_transaction(tx, incoming, inbound, read_at, Decision.DELIVER)
            return self._decide_in_own_transaction(incoming, inbound, read_at)
        nested = session.begin_nested()
        try:
            decision = self.rlog_decision(session, incoming, inbound, read_at, True)
        except sa.exc.OperationalError as exc:
            nested.rollback()
            if getattr(exc.orig, "sqlstate", None) != DEADLOCK_DETECTED:
                raise
            # PostgreSQL broke a lock cycle by failing this statement: requeue and go on.
            log.info("deadlock on cm %s; requeued, the transaction goes on", inbound.cm_id)
            return None, self._put_back(incoming)
        if decision is Decision.DELIVER or rlog_row in tx.locked_rlog_rows:
            nested.commit()
            return self._keep_in_transaction(tx, incoming, inbound, read_at, decision)
        nested.rollback()
        return self._decide_in_own_transaction(incoming, inbound, read_at)

    @staticmethod
    def _keep_in_transaction(
        tx: ReceiverTransaction,
        incoming: Incoming,
        inbound: Inbound,
        read_at: datetime,
        decision: Decision,
    ) -> tuple[Decision, Disposal]:
        """Note a decision taken inside the app's transaction, which settles the delivery
        at its end."""
        delivered = decision is Decision.DELIVER
        if delivered:
            tx.locked_rlog_rows.add((inbound.cm_id, inbound.destination))
        tx.taken_messages.append(TakenMessage(incoming, inbound, read_at, delivered=delivered))
        return decision, Disposal(Fate.LEFT)

    def _decide_in_own_transaction(
        self, incoming: Incoming, inbound: Inbound, read_at: datetime
    ) -> tuple[Decision | None, Disposal]:
        """Record a non-delivering decision in its own transaction; the delivery is then
        acked (its RLOG row drops a redelivery).

        If the facts changed meanwhile and the message would now be delivered, it is
        requeued instead (a transactional read must deliver within the app's transaction).
        The lock timeout breaks a wait that PostgreSQL cannot see: this thread's own app
        transaction may hold the row another consumer is waiting behind.
        """
        try:
            with Session(self._ctx.engine) as own, own.begin():
                self._ctx.store.limit_lock_wait(own, LOCK_TIMEOUT_MS)
                decision = self.rlog_decision(own, incoming, inbound, read_at, True)
                if decision is Decision.DELIVER:
                    own.rollback()
                    return None, self._put_back(incoming)
        except sa.exc.OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) not in (DEADLOCK_DETECTED, LOCK_NOT_AVAILABLE):
                raise
            return None, self._put_back(incoming)
        return decision, Disposal(Fate.ACK_DEFERRED)

    def _put_back(self, incoming: Incoming) -> Disposal:
        """Leave a message undecided for a later read: a delivery is requeued; a
        reassembled sequence stays in the store (its parts' deletion is rolled back)."""
        if incoming.delivery is not None:
            return Disposal(Fate.REQUEUE)
        self._ctx.pending.maybe_complete = True
        return Disposal(Fate.LEFT)

    def _reading(self, incoming: Incoming, read_at: datetime, *, transactional: bool) -> Reading:
        return Reading(
            message_id=incoming.message_id,
            recipient=self._ctx.recipient,
            receiver=self._ctx.receiver_id,
            read_at=read_at,
            transactional=transactional,
        )

    def rlog_decision(
        self,
        session: Session,
        incoming: Incoming,
        inbound: Inbound,
        read_at: datetime,
        transactional: bool,
    ) -> Decision:
        """The RLOG's decision in ``session``; a non-transactional delivery's READ ack
        goes to the outbox in the same transaction."""
        if inbound.kind is MessageKind.COMPENSATION:
            return on_compensation(
                self._ctx.store, session, inbound, receiver=self._ctx.receiver_id, now=read_at
            )
        if inbound.kind is MessageKind.SUCCESS:
            return on_success(self._ctx.store, session, inbound, now=read_at)
        reading = self._reading(incoming, read_at, transactional=transactional)
        decision = on_original(self._ctx.store, session, inbound, reading)
        if decision is Decision.DELIVER and not transactional:
            enqueue_ack(
                session,
                inbound,
                kind=AckKind.READ,
                read_at=read_at,
                committed_at=None,
                recipient=self._ctx.recipient,
                receiver=self._ctx.receiver_id,
            )
        return decision

    def _count_decision(self, decision: Decision, inbound: Inbound) -> None:
        if decision is Decision.DELIVER:
            self._ctx.stats.delivered += 1
        elif decision is Decision.DUPLICATE:
            self._ctx.stats.duplicates += 1
        elif decision is Decision.DISCARD:
            self._ctx.stats.discards += 1
            log.info(
                "discarded cm %s at %s: compensated before it was read",
                inbound.cm_id,
                inbound.destination,
            )
        else:
            self._ctx.stats.cancelled += 1
