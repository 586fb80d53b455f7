"""The receiver log (RLOG) decisions: deliver, drop as duplicate, or cancel out.

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

from datetime import datetime
from enum import Enum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from ackd.inbound import Inbound
from ackd.receiver_store import ReceiverStore
from ackd.tables import RlogState, rlog, rx_inbox
from condmsg.protocol import MessageKind


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
    inbound: Inbound,
    *,
    message_id: str | None,
    recipient: str,
    receiver: str,
    read_at: datetime,
    transactional: bool,
) -> bool:
    """The first step of :func:`on_original`: insert the ``consumed`` row. True means the
    original is delivered (and this transaction holds the row); False means a row exists
    and nothing was written or locked (:func:`on_original` decides what it means)."""
    cm_id, destination = _key(inbound)
    values = {
        "cm_id": cm_id,
        "destination": destination,
        "state": RlogState.CONSUMED.value,
        "message_id": message_id,
        "recipient": recipient,
        "receiver": receiver,
        "sender": inbound.sender,
        "read_at": read_at,
        "transactional": transactional,
        "updated_at": read_at,
    }
    return store.claim_original(session, values)


def on_original(
    store: ReceiverStore,
    session: Session,
    inbound: Inbound,
    *,
    message_id: str | None,
    recipient: str,
    receiver: str,
    read_at: datetime,
    transactional: bool,
) -> Decision:
    if claim_original(
        store,
        session,
        inbound,
        message_id=message_id,
        recipient=recipient,
        receiver=receiver,
        read_at=read_at,
        transactional=transactional,
    ):
        return Decision.DELIVER
    cm_id, destination = _key(inbound)
    row = _locked_row(session, cm_id, destination).one()
    if row.state == RlogState.CONSUMED.value:
        return Decision.DUPLICATE
    if row.discarded_at is None:
        _update(session, cm_id, destination, discarded_at=read_at, message_id=message_id)
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
