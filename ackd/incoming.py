"""What a ``Receiver`` keeps between reads: the messages taken until they are settled,
and what it knows of the sequences waiting in its store."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from ackd.broker import Delivery
from ackd.inbound import Inbound
from ackd.message import Message

if TYPE_CHECKING:
    from ackd.receiver import Receiver


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
class Incoming:
    """A message ready for the RLOG decision: an AMQP delivery (``delivery``) or a
    sequence reassembled from the store (``delivery`` None, ``message_id`` its seq id)."""

    queue: str
    body: bytes
    content_type: str | None
    message_id: str | None
    headers: dict[str, Any]
    redelivered: bool
    delivery: Delivery | None


@dataclass(slots=True)
class TakenMessage:
    """A message taken inside an app's transaction, settled when it ends. ``delivered``:
    the app got it with an RLOG row this transaction holds (an original's COMMIT ack is
    owed); plain messages and stored parts are taken with it False."""

    incoming: Incoming
    inbound: Inbound
    read_at: datetime
    delivered: bool


@dataclass(slots=True)
class ReceiverTransaction:
    """One transactional read scope: ``session`` is the app's, ``read`` takes messages."""

    receiver: Receiver
    session: Session
    taken_messages: list[TakenMessage] = field(default_factory=list)
    #: The (CM, destination) RLOG rows this transaction delivered and therefore keeps locked.
    locked_rlog_rows: set[tuple[str | None, str | None]] = field(default_factory=set)

    def read(self, queue: str, timeout: float = 5.0) -> Message | None:
        """The next message of ``queue`` within this transaction, or None on timeout."""
        return self.receiver._reader.next_message(queue, timeout, self)


@dataclass(slots=True)
class PendingSequences:
    """Whether the store may hold a complete sequence for this receiver, and the
    reassembled sequences held back for their backoff after a failed attempt.

    Looking in the store costs a query, so a reader looks only when something may have
    completed a sequence (a part stored, a transaction committed or rolled back, a
    sequence put back) and, as a safety net, every few seconds: other consumers' commits
    complete sequences too.
    """

    maybe_complete: bool = True
    #: ``time.monotonic()`` after which a reader looks regardless.
    next_recheck: float = 0.0
    #: Seq id -> ``time.monotonic()`` before which it is not taken again.
    retry_due: dict[str, float] = field(default_factory=dict)

    def is_held_back(self, seq_id: str) -> bool:
        due = self.retry_due.get(seq_id)
        if due is None:
            return False
        if time.monotonic() < due:
            return True
        del self.retry_due[seq_id]
        return False


def message_for(incoming: Incoming, inbound: Inbound, read_at: datetime) -> Message:
    """What the application gets for a message it is handed."""
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


def undecodable(exc: BaseException) -> str:
    """The invalid-queue reason for an unexpected exception while judging a message."""
    try:
        detail = str(exc)
    except Exception:  # an exception whose message itself fails
        detail = "?"
    return f"undecodable: {type(exc).__name__}: {detail}"
