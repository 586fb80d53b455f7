"""The kit's in-memory broker: named queues, the default exchange, priorities, per-message
expiry and redelivery, on the virtual clock.

It holds what RabbitMQ holds for condmsg and behaves as RabbitMQ does where condmsg's
outcome depends on it: a queue hands out its highest-priority message first (first in,
first out within a priority: compensations overtake the unread original), a message whose
``expiration`` passed is dropped unread, a message given back keeps its place and comes
again marked ``redelivered``, and a ``mandatory`` message with no queue to go to comes back
to its publisher (the relay parks its row). Only the default exchange routes: a
destination addressed to another exchange is refused as unroutable, as RabbitMQ refuses a
mandatory message to an exchange with no binding for it. A queue comes into being when a
message is first published to it by name: in production the sender declares its
destination queues and its ack and outcome queues before anything is published to them.

Nothing here is thread-safe: the kit runs every part in the test's thread.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from outbox.message import OutboxMessage


@dataclass(slots=True)
class Queued:
    """One message in a queue (or taken from it and not yet settled)."""

    queue: str
    message: OutboxMessage
    #: Publish order: what keeps a queue first in, first out within a priority.
    seq: int
    expires_at: datetime | None = None
    redelivered: bool = False

    @property
    def priority(self) -> int:
        return self.message.priority or 0


@dataclass(slots=True)
class MemoryQueue:
    name: str
    messages: list[Queued] = field(default_factory=list)

    def put(self, item: Queued) -> None:
        self.messages.append(item)

    def ready(self, now: datetime) -> list[Queued]:
        """The messages not expired at ``now``, in the order they are taken (highest
        priority, then oldest); expired ones are dropped, as RabbitMQ drops them."""
        self.messages = [m for m in self.messages if m.expires_at is None or m.expires_at > now]
        return sorted(self.messages, key=lambda m: (-m.priority, m.seq))

    def take(self, now: datetime) -> Queued | None:
        """The next message, or None."""
        ready = self.ready(now)
        if not ready:
            return None
        self.messages.remove(ready[0])
        return ready[0]


class MemoryBroker:
    """Queues by name, on ``clock``'s time line (see the module docstring)."""

    def __init__(self, clock: Callable[[], datetime]) -> None:
        self._clock = clock
        self._queues: dict[str, MemoryQueue] = {}
        self._seq = itertools.count(1)
        #: Every message published, in order: (queue, message), for tests that look.
        self.published: list[tuple[str, OutboxMessage]] = []

    def declare(self, queue: str) -> None:
        self._queues.setdefault(queue, MemoryQueue(queue))

    def exists(self, queue: str) -> bool:
        return queue in self._queues

    def publish(self, message: OutboxMessage) -> str | None:
        """Put ``message`` on the queue it is addressed to; the reason it was returned
        (unroutable), or None once it is queued (or dropped, if not ``mandatory``)."""
        target = None
        if message.exchange == "":
            self.declare(message.routing_key)
            target = self._queues[message.routing_key]
        if target is None:
            if not message.mandatory:
                return None
            where = message.exchange or "the default exchange"
            return f"unroutable: no queue for {message.routing_key!r} on {where} (NO_ROUTE)"
        expires_at = None
        if message.expiration_ms is not None:
            expires_at = self._clock() + timedelta(milliseconds=message.expiration_ms)
        target.put(Queued(target.name, message, next(self._seq), expires_at))
        self.published.append((target.name, message))
        return None

    def take(self, queue: str) -> Queued | None:
        """The next message of ``queue`` (unsettled: :meth:`give_back` or drop it)."""
        found = self._queues.get(queue)
        return None if found is None else found.take(self._clock())

    def give_back(self, item: Queued) -> None:
        """Return a taken message to its queue, in its place, marked redelivered."""
        item.redelivered = True
        self.declare(item.queue)
        self._queues[item.queue].put(item)

    def take_all(self, queue: str) -> list[Queued]:
        """Every message of ``queue``, taken for good (a consumer that acks them all)."""
        taken = []
        while (item := self.take(queue)) is not None:
            taken.append(item)
        return taken

    def depth(self, queue: str) -> int:
        """Messages ready in ``queue`` (expired ones not counted)."""
        found = self._queues.get(queue)
        if found is None:
            return 0
        return len(found.ready(self._clock()))

    def peek(self, queue: str) -> list[OutboxMessage]:
        """The messages ready in ``queue``, in the order they would be taken."""
        found = self._queues.get(queue)
        if found is None:
            return []
        return [m.message for m in found.ready(self._clock())]

    def properties(self, item: Queued) -> dict[str, Any]:
        """The AMQP properties of ``item`` as pika's ``BasicProperties`` takes them."""
        m = item.message
        return {
            "content_type": m.content_type,
            "content_encoding": m.content_encoding,
            "headers": dict(m.headers) if m.headers is not None else None,
            "delivery_mode": 2 if m.persistent else 1,
            "priority": m.priority,
            "correlation_id": m.correlation_id,
            "reply_to": m.reply_to,
            "expiration": None if m.expiration_ms is None else str(m.expiration_ms),
            "message_id": m.message_id,
            "type": m.message_type,
        }
