"""The RLOG decision on a judged conditional message: deliver it, or drop it as a
duplicate, a discarded original or a cancelled-out compensation, inside or beside the
app's transaction."""

from __future__ import annotations

import logging
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from ackd import rlog
from ackd.broker import Broker
from ackd.emit import enqueue_ack
from ackd.inbound import Inbound
from ackd.incoming import (
    Incoming,
    PendingSequences,
    ReceiverStats,
    ReceiverTransaction,
    TakenMessage,
    message_for,
)
from ackd.message import Message
from ackd.receiver_store import ReceiverStore, StoreTraits
from condmsg.acks import AckKind
from condmsg.protocol import MessageKind

log = logging.getLogger(__name__)

#: PostgreSQL SQLSTATEs: a detected deadlock, a lock wait cut by ``lock_timeout``.
DEADLOCK_DETECTED = "40P01"
LOCK_NOT_AVAILABLE = "55P03"
#: How long a side transaction of a transactional read waits for an RLOG row.
LOCK_TIMEOUT_MS = 2000


class RlogDecisions:
    """Takes the RLOG decisions of one receiver and counts them in ``stats``.

    ``traits`` are those of ``store`` attached to ``engine``: where rows are locked
    (``row_locks``), a decision that delivers nothing leaves the app's transaction.
    """

    def __init__(
        self,
        *,
        engine: Engine,
        store: ReceiverStore,
        traits: StoreTraits,
        broker: Broker,
        stats: ReceiverStats,
        pending: PendingSequences,
        recipient: str,
        receiver_id: str,
    ) -> None:
        self._engine = engine
        self._store = store
        self._row_locks = traits.row_locks
        self._broker = broker
        self._stats = stats
        self._pending = pending
        self._recipient = recipient
        self._receiver_id = receiver_id

    def decide(
        self,
        session: Session,
        incoming: Incoming,
        inbound: Inbound,
        read_at: datetime,
        tx: ReceiverTransaction | None,
    ) -> Message | None:
        """The RLOG decision, in ``session``; for a non-transactional read also the ack."""
        if tx is None:
            decision = self.rlog_decision(session, incoming, inbound, read_at, False)
        else:
            found = self._decide_in_transaction(tx, incoming, inbound, read_at)
            if found is None:
                return None
            decision = found
        self._count_decision(decision, inbound)
        if decision is not rlog.Decision.DELIVER:
            return None
        return message_for(incoming, inbound, read_at)

    def _decide_in_transaction(
        self, tx: ReceiverTransaction, incoming: Incoming, inbound: Inbound, read_at: datetime
    ) -> rlog.Decision | None:
        """The RLOG decision of a transactional read; None if the message was requeued.

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
        if not self._row_locks:
            decision = self.rlog_decision(session, incoming, inbound, read_at, True)
            return self._keep_in_transaction(tx, incoming, inbound, read_at, decision)
        if inbound.kind is MessageKind.ORIGINAL and not tx.locked_rlog_rows:
            # The common case, without a SAVEPOINT: the insert either claims the row (and
            # this transaction keeps it) or conflicts, which writes and locks nothing.
            # Holding no RLOG row yet, this transaction cannot be part of a lock cycle
            # through the RLOG.
            if rlog.claim_original(
                self._store,
                session,
                inbound,
                message_id=incoming.message_id,
                recipient=self._recipient,
                receiver=self._receiver_id,
                read_at=read_at,
                transactional=True,
            ):
                return self._keep_in_transaction(
                    tx, incoming, inbound, read_at, rlog.Decision.DELIVER
                )
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
            self._put_back(incoming)
            return None
        if decision is rlog.Decision.DELIVER or rlog_row in tx.locked_rlog_rows:
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
        decision: rlog.Decision,
    ) -> rlog.Decision:
        """Note a decision taken inside the app's transaction (settled at its end)."""
        delivered = decision is rlog.Decision.DELIVER
        if delivered:
            tx.locked_rlog_rows.add((inbound.cm_id, inbound.destination))
        tx.taken_messages.append(TakenMessage(incoming, inbound, read_at, delivered=delivered))
        return decision

    def _decide_in_own_transaction(
        self, incoming: Incoming, inbound: Inbound, read_at: datetime
    ) -> rlog.Decision | None:
        """Record a non-delivering decision in its own transaction, then ack the message.

        If the facts changed meanwhile and the message would now be delivered, it is
        requeued instead (a transactional read must deliver within the app's transaction).
        The lock timeout breaks a wait that PostgreSQL cannot see: this thread's own app
        transaction may hold the row another consumer is waiting behind.
        """
        try:
            with Session(self._engine) as own, own.begin():
                self._store.limit_lock_wait(own, LOCK_TIMEOUT_MS)
                decision = self.rlog_decision(own, incoming, inbound, read_at, True)
                if decision is rlog.Decision.DELIVER:
                    own.rollback()
                    self._put_back(incoming)
                    return None
        except sa.exc.OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) not in (DEADLOCK_DETECTED, LOCK_NOT_AVAILABLE):
                raise
            self._put_back(incoming)
            return None
        if incoming.delivery is not None:
            self._broker.ack(incoming.delivery, deferred=True)
        return decision

    def _put_back(self, incoming: Incoming) -> None:
        """Leave a message undecided for a later read: requeue a delivery; a reassembled
        sequence stays in the store (its parts' deletion is rolled back)."""
        if incoming.delivery is not None:
            self._broker.requeue(incoming.delivery)
        else:
            self._pending.maybe_complete = True

    def rlog_decision(
        self,
        session: Session,
        incoming: Incoming,
        inbound: Inbound,
        read_at: datetime,
        transactional: bool,
    ) -> rlog.Decision:
        """The RLOG's decision in ``session``; a non-transactional delivery's READ ack
        goes to the outbox in the same transaction."""
        if inbound.kind is MessageKind.COMPENSATION:
            return rlog.on_compensation(
                self._store, session, inbound, receiver=self._receiver_id, now=read_at
            )
        if inbound.kind is MessageKind.SUCCESS:
            return rlog.on_success(self._store, session, inbound, now=read_at)
        decision = rlog.on_original(
            self._store,
            session,
            inbound,
            message_id=incoming.message_id,
            recipient=self._recipient,
            receiver=self._receiver_id,
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
                recipient=self._recipient,
                receiver=self._receiver_id,
            )
        return decision

    def _count_decision(self, decision: rlog.Decision, inbound: Inbound) -> None:
        if decision is rlog.Decision.DELIVER:
            self._stats.delivered += 1
        elif decision is rlog.Decision.DUPLICATE:
            self._stats.duplicates += 1
        elif decision is rlog.Decision.DISCARD:
            self._stats.discards += 1
            log.info(
                "discarded cm %s at %s: compensated before it was read",
                inbound.cm_id,
                inbound.destination,
            )
        else:
            self._stats.cancelled += 1
