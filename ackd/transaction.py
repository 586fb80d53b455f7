"""What a receiver takes: a message on its way to the app (:class:`Taken`), and the
transactional read scope (:class:`ReceiverTransaction`) that holds the messages it took
until it is settled."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from ackd.broker import Delivery
from ackd.message import Message
from ackd.validation import Inbound


@dataclass(slots=True, kw_only=True)
class Taken:
    """One message a receiver took, on its way to the app: an AMQP delivery (``delivery``)
    or a sequence reassembled from the store (``delivery`` None, ``message_id`` its seq
    id), with its condmsg headers as judged (``inbound``) and when it was read
    (``read_at``, this receiver's clock).

    An app's transaction holds what it took until it ends; ``delivered`` then says that
    the app got it with an RLOG row this transaction holds (an original's COMMIT ack is
    owed). Plain messages and stored parts are held with it False.
    """

    queue: str
    body: bytes
    content_type: str | None
    message_id: str | None
    headers: dict[str, Any]
    redelivered: bool
    delivery: Delivery | None
    inbound: Inbound
    read_at: datetime
    delivered: bool = False

    def message(self) -> Message:
        """What the application gets when it is handed this message."""
        return Message(
            queue=self.queue,
            body=self.body,
            kind=self.inbound.kind,
            cm_id=self.inbound.cm_id,
            destination=self.inbound.destination,
            sender=self.inbound.sender,
            message_id=self.message_id,
            content_type=self.content_type,
            headers=self.headers,
            read_at=self.read_at,
            redelivered=self.redelivered,
        )


#: ``(queue, timeout, transaction)`` to the next message of ``queue`` taken within the
#: transaction, or None on timeout.
NextMessage = Callable[[str, float, "ReceiverTransaction"], Message | None]


@dataclass(slots=True)
class ReceiverTransaction:
    """One transactional read scope: ``session`` is the app's, ``read`` takes messages."""

    session: Session
    #: Given by the receiver: how ``read`` takes the next message.
    _next_message: NextMessage = field(repr=False)
    taken_messages: list[Taken] = field(default_factory=list)
    #: The (CM, destination) RLOG rows this transaction delivered and therefore keeps locked.
    locked_rlog_rows: set[tuple[str | None, str | None]] = field(default_factory=set)

    def read(self, queue: str, timeout: float = 5.0) -> Message | None:
        """The next message of ``queue`` within this transaction, or None on timeout."""
        return self._next_message(queue, timeout, self)

    def keep(self, taken: Taken, *, delivered: bool = False) -> None:
        """Hold ``taken`` until this transaction ends; ``delivered``: the app gets it with
        the RLOG row of its CM and destination, which this transaction keeps locked."""
        taken.delivered = delivered
        if delivered:
            self.locked_rlog_rows.add((taken.inbound.cm_id, taken.inbound.destination))
        self.taken_messages.append(taken)
