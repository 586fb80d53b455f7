"""What a receiver takes: a message ready for its RLOG decision (:class:`Incoming`), and
the transactional read scope (:class:`ReceiverTransaction`) that holds the messages it
took (:class:`TakenMessage`) until it is settled."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from ackd.broker import Delivery
from ackd.message import Message
from ackd.validation import Inbound


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

    def message(self, inbound: Inbound, read_at: datetime) -> Message:
        """What the application gets when it is handed this message."""
        return Message(
            queue=self.queue,
            body=self.body,
            kind=inbound.kind,
            cm_id=inbound.cm_id,
            destination=inbound.destination,
            sender=inbound.sender,
            message_id=self.message_id,
            content_type=self.content_type,
            headers=self.headers,
            read_at=read_at,
            redelivered=self.redelivered,
        )


@dataclass(slots=True)
class TakenMessage:
    """A message taken inside an app's transaction, settled when it ends. ``delivered``:
    the app got it with an RLOG row this transaction holds (an original's COMMIT ack is
    owed); plain messages and stored parts are taken with it False."""

    incoming: Incoming
    inbound: Inbound
    read_at: datetime
    delivered: bool


#: ``(queue, timeout, transaction)`` to the next message of ``queue`` taken within the
#: transaction, or None on timeout.
NextMessage = Callable[[str, float, "ReceiverTransaction"], Message | None]


@dataclass(slots=True)
class ReceiverTransaction:
    """One transactional read scope: ``session`` is the app's, ``read`` takes messages."""

    session: Session
    #: Given by the receiver: how ``read`` takes the next message.
    _next_message: NextMessage = field(repr=False)
    taken_messages: list[TakenMessage] = field(default_factory=list)
    #: The (CM, destination) RLOG rows this transaction delivered and therefore keeps locked.
    locked_rlog_rows: set[tuple[str | None, str | None]] = field(default_factory=set)

    def read(self, queue: str, timeout: float = 5.0) -> Message | None:
        """The next message of ``queue`` within this transaction, or None on timeout."""
        return self._next_message(queue, timeout, self)
