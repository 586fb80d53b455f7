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
from ackd.transaction import ReceiverTransaction, Taken
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


def claim_original(
    store: ReceiverStore,
    session: Session,
    taken: Taken,
    *,
    recipient: str,
    receiver: str,
    transactional: bool,
) -> bool:
    """The first step of :func:`on_original`: insert the ``consumed`` row, which records
    who read ``taken`` (``recipient``, ``receiver``), when and how. True means the
    original is delivered (and this transaction holds the row); False means a row exists
    and nothing was written or locked (:func:`on_original` decides what it means)."""
    cm_id, destination = _key(taken.inbound)
    values = {
        "cm_id": cm_id,
        "destination": destination,
        "state": RlogState.CONSUMED.value,
        "message_id": taken.message_id,
        "recipient": recipient,
        "receiver": receiver,
        "sender": taken.inbound.sender,
        "read_at": taken.read_at,
        "transactional": transactional,
        "updated_at": taken.read_at,
    }
    return store.claim_original(session, values)


def on_original(
    store: ReceiverStore,
    session: Session,
    taken: Taken,
    *,
    recipient: str,
    receiver: str,
    transactional: bool,
) -> Decision:
    claimed = claim_original(
        store, session, taken, recipient=recipient, receiver=receiver, transactional=transactional
    )
    if claimed:
        return Decision.DELIVER
    cm_id, destination = _key(taken.inbound)
    row = _locked_row(session, cm_id, destination).one()
    if row.state == RlogState.CONSUMED.value:
        return Decision.DUPLICATE
    if row.discarded_at is None:
        _update(
            session,
            cm_id,
            destination,
            discarded_at=taken.read_at,
            message_id=taken.message_id,
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
        self, session: Session, taken: Taken, tx: ReceiverTransaction | None
    ) -> tuple[Message | None, Disposal]:
        """The RLOG decision, in ``session`` (for a non-transactional read with its READ
        ack): the message the app gets, or None, and what becomes of the delivery at the
        broker once ``session`` has committed (a reassembled sequence has none to settle)."""
        if tx is None:
            decision = self.rlog_decision(session, taken, False)
            disposal = Disposal(Fate.ACK_DEFERRED)  # the RLOG row drops a redelivery
        else:
            found, disposal = self._decide_in_transaction(tx, taken)
            if found is None:
                return None, disposal
            decision = found
        self._count_decision(decision, taken.inbound)
        if decision is not Decision.DELIVER:
            return None, disposal
        return taken.message(), disposal

    def _decide_in_transaction(
        self, tx: ReceiverTransaction, taken: Taken
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
        session, inbound = tx.session, taken.inbound
        rlog_row = (inbound.cm_id, inbound.destination)
        if not self._ctx.row_locks:
            decision = self.rlog_decision(session, taken, True)
            return self._keep_in_transaction(tx, taken, decision)
        if inbound.kind is MessageKind.ORIGINAL and not tx.locked_rlog_rows:
            # The common case, without a SAVEPOINT: the insert either claims the row (and
            # this transaction keeps it) or conflicts, which writes and locks nothing.
            # Holding no RLOG row yet, this transaction cannot be part of a lock cycle
            # through the RLOG.
            if self._claim_original(session, taken, transactional=True):
                return self._keep_in_transaction(tx, taken, Decision.DELIVER)
            return self._decide_in_own_transaction(taken)
        nested = session.begin_nested()
        try:
            decision = self.rlog_decision(session, taken, True)
        except sa.exc.OperationalError as exc:
            nested.rollback()
            if getattr(exc.orig, "sqlstate", None) != DEADLOCK_DETECTED:
                raise
            # PostgreSQL broke a lock cycle by failing this statement: requeue and go on.
            log.info("deadlock on cm %s; requeued, the transaction goes on", inbound.cm_id)
            return None, self._put_back(taken)
        if decision is Decision.DELIVER or rlog_row in tx.locked_rlog_rows:
            nested.commit()
            return self._keep_in_transaction(tx, taken, decision)
        nested.rollback()
        return self._decide_in_own_transaction(taken)

    @staticmethod
    def _keep_in_transaction(
        tx: ReceiverTransaction, taken: Taken, decision: Decision
    ) -> tuple[Decision, Disposal]:
        """Note a decision taken inside the app's transaction, which settles the delivery
        at its end."""
        tx.keep(taken, delivered=decision is Decision.DELIVER)
        return decision, Disposal(Fate.LEFT)

    def _decide_in_own_transaction(self, taken: Taken) -> tuple[Decision | None, Disposal]:
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
                decision = self.rlog_decision(own, taken, True)
                if decision is Decision.DELIVER:
                    own.rollback()
                    return None, self._put_back(taken)
        except sa.exc.OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) not in (DEADLOCK_DETECTED, LOCK_NOT_AVAILABLE):
                raise
            return None, self._put_back(taken)
        return decision, Disposal(Fate.ACK_DEFERRED)

    def _put_back(self, taken: Taken) -> Disposal:
        """Leave a message undecided for a later read: a delivery is requeued; a
        reassembled sequence stays in the store (its parts' deletion is rolled back)."""
        if taken.delivery is not None:
            return Disposal(Fate.REQUEUE)
        self._ctx.pending.maybe_complete = True
        return Disposal(Fate.LEFT)

    def _claim_original(self, session: Session, taken: Taken, *, transactional: bool) -> bool:
        return claim_original(
            self._ctx.store,
            session,
            taken,
            recipient=self._ctx.recipient,
            receiver=self._ctx.receiver_id,
            transactional=transactional,
        )

    def rlog_decision(self, session: Session, taken: Taken, transactional: bool) -> Decision:
        """The RLOG's decision in ``session``; a non-transactional delivery's READ ack
        goes to the outbox in the same transaction."""
        inbound, read_at = taken.inbound, taken.read_at
        if inbound.kind is MessageKind.COMPENSATION:
            return on_compensation(
                self._ctx.store, session, inbound, receiver=self._ctx.receiver_id, now=read_at
            )
        if inbound.kind is MessageKind.SUCCESS:
            return on_success(self._ctx.store, session, inbound, now=read_at)
        decision = on_original(
            self._ctx.store,
            session,
            taken,
            recipient=self._ctx.recipient,
            receiver=self._ctx.receiver_id,
            transactional=transactional,
        )
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
