"""What a test does as a receiver in the kit: :class:`KitReceiver` (a real
:class:`~ackd.receiver.Receiver` on the kit's broker and clock, and what its application
got) and :class:`KitTransaction` (a transactional read scope that does not wait)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy.orm import Session

from ackd.message import Message
from ackd.reader import Handler
from ackd.receiver import Receiver
from ackd.transaction import ReceiverTransaction
from condmsg.core.errors import ConfigError
from condmsg.core.protocol import MessageKind
from condmsg.testing.memory_broker import MemoryBroker
from condmsg.testing.receiver_broker import MemoryReceiverBroker, UntilDrained
from condmsg.testing.relaying import relay_outbox
from outbox.store import OutboxStore


class KitTransaction:
    """A receiver transaction in the kit: :meth:`read` does not wait (the queue has what
    the world put there by now); ``session`` is the app's session."""

    def __init__(self, tx: ReceiverTransaction, receiver: KitReceiver) -> None:
        self._tx = tx
        self._receiver = receiver
        self.session: Session = tx.session

    def read(self, queue: str) -> Message | None:
        """The next message of ``queue`` within this transaction, or None."""
        message = self._tx.read(queue, 0.0)
        self._receiver._got(message)
        return message


@dataclass(slots=True)
class _Consumer:
    queue: str
    handler: Handler
    transactional: bool


class KitReceiver:
    """One final recipient: a real :class:`~ackd.receiver.Receiver` (``receiver``) on the
    kit's broker and clock, and what its application got (``messages``)."""

    def __init__(
        self,
        receiver: Receiver,
        broker: MemoryReceiverBroker,
        *,
        memory: MemoryBroker,
        settle: Callable[[], None],
    ) -> None:
        """``broker`` is the receiver's side of the kit's broker ``memory``; ``settle``
        lets the kit's world settle after each thing the receiver does."""
        self._memory = memory
        self._settle = settle
        self.receiver = receiver
        self.recipient = receiver.recipient
        self.broker = broker
        self.outbox = OutboxStore(receiver.engine)
        #: Every message handed to the application, in order (compensations and success
        #: notices included; a message of a rolled-back transaction too: the app had it).
        self.messages: list[Message] = []
        self.away = False
        self._in_transaction = False
        self._consumers: list[_Consumer] = []
        #: Whether its outbox may hold acks that no relay round has seen yet.
        self.unrelayed = True

    def __repr__(self) -> str:
        return f"KitReceiver({self.recipient!r})"

    @property
    def active(self) -> bool:
        """Whether its process works now: not away, not inside an open transaction
        (SQLite holds the store's write lock until the transaction ends)."""
        return not self.away and not self._in_transaction

    # -- what the application does ----------------------------------------------------------

    def read(self, queue: str) -> Message | None:
        """A non-transactional read (a READ ack); None if ``queue`` has nothing now."""
        self._check_present("read")
        self._settle()
        message = self.receiver.read(queue, 0.0)
        self._got(message)
        self.unrelayed = True
        self._settle()
        return message

    @contextmanager
    def transaction(self) -> Iterator[KitTransaction]:
        """A transactional read scope: commits on a clean exit (then the COMMIT acks go
        out), rolls back on an exception (the messages go back after their retry pause).
        The clock may be advanced inside it: the commit then happens later."""
        self._check_present("open a transaction")
        self._settle()
        self._in_transaction = True
        try:
            with self.receiver.transaction() as tx:
                yield KitTransaction(tx, self)
        finally:
            self._in_transaction = False
            self.unrelayed = True
            self._settle()

    def consume(self, queue: str, handler: Handler, *, transactional: bool = True) -> None:
        """Have ``handler(message, session)`` take every message of ``queue`` as it comes,
        through ``Receiver.consume`` (a transaction per message when ``transactional``;
        ``session`` is None otherwise), from now on while the receiver is present."""

        def recording(message: Message, session: Session | None) -> None:
            self._got(message)
            handler(message, session)

        self._consumers.append(_Consumer(queue, recording, transactional))
        self._settle()

    def go_away(self) -> None:
        """The receiver's process goes down: it reads nothing, its relay publishes none of
        its acks, and what it had taken unsettled goes back to the queues."""
        self.away = True
        self.broker.close()

    def come_back(self) -> None:
        """The process is back: its relay publishes what waited, its consumers resume."""
        self.away = False
        self.unrelayed = True
        self._settle()

    # -- what it got ------------------------------------------------------------------------

    def originals(self) -> list[Message]:
        return [m for m in self.messages if m.kind is MessageKind.ORIGINAL]

    def compensations(self) -> list[Message]:
        return [m for m in self.messages if m.kind is MessageKind.COMPENSATION]

    def notices(self) -> list[Message]:
        """Success notices handed to the application."""
        return [m for m in self.messages if m.kind is MessageKind.SUCCESS]

    # -- the kit's side ---------------------------------------------------------------------

    def _got(self, message: Message | None) -> None:
        if message is not None:
            self.messages.append(message)

    def _check_present(self, doing: str) -> None:
        if self.away:
            raise ConfigError(f"receiver {self.recipient!r} is away: it cannot {doing}")

    def _work(self) -> int:
        """Run its consumers and relay its acks once; how much moved."""
        moved = 0
        for consumer in self._consumers:
            self.broker.drained = False
            moved += self.receiver.consume(
                consumer.queue,
                consumer.handler,
                transactional=consumer.transactional,
                stop=UntilDrained(self.broker),
            )
        if moved or self.unrelayed:
            # Only what the receiver did writes to its outbox: a store nobody touched
            # since its last relay round is not asked again.
            self.unrelayed = False
            moved += relay_outbox(self.outbox, self._memory)
        return moved
