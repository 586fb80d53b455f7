"""The receiver's side of the in-memory broker: :class:`ackd.broker.Broker`'s interface
over a :class:`~condmsg.testing.memory_broker.MemoryBroker`.

The receiver code (reading, acceptance, the RLOG, settlement) calls the same methods it
calls on the pika-backed broker, and this class gives them RabbitMQ's meaning: a taken
delivery is unsettled until acked or given back, a requeue with a pause holds the
delivery back until the virtual clock passes the pause (nothing sleeps), and closing the
connection gives back whatever was unsettled, as RabbitMQ does when a consumer goes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator
from datetime import datetime, timedelta
from typing import Any

import pika

from ackd.broker import Broker, Delivery, invalid_headers
from condmsg.core import protocol
from condmsg.testing.memory_broker import MemoryBroker, Queued
from outbox.message import OutboxMessage


class MemoryReceiverBroker(Broker):
    """One receiver's connection to ``memory`` (see the module docstring)."""

    def __init__(
        self,
        memory: MemoryBroker,
        clock: Callable[[], datetime],
        *,
        name: str,
        invalid_queue: str = protocol.INVALID_MESSAGE_QUEUE,
    ) -> None:
        super().__init__("memory://", name=name, invalid_queue=invalid_queue, queue_type="classic")
        self._memory = memory
        self._clock = clock
        self._tags = 0
        #: Deliveries taken and not settled, by tag.
        self._held: dict[int, Queued] = {}
        #: Deliveries held back before their requeue: (due on the virtual clock, tag).
        self._paused: list[tuple[datetime, int]] = []
        #: Set when :meth:`consume` found its queue empty: the kit ends a consume there.
        self.drained = False
        memory.declare(invalid_queue)

    # -- taking ---------------------------------------------------------------------------

    def ensure_queue(self, queue: str) -> None:
        self._memory.declare(queue)

    def get(self, queue: str) -> Delivery | None:
        self.ensure_queue(queue)
        self.release_due()
        item = self._memory.take(queue)
        if item is None:
            return None
        self._tags += 1
        self._held[self._tags] = item
        return Delivery(
            queue,
            self._tags,
            item.redelivered,
            pika.BasicProperties(**self._memory.properties(item)),
            item.message.body,
        )

    def consume(
        self, queue: str, *, prefetch: int, inactivity_s: float
    ) -> Generator[Delivery | None, None, None]:
        """Deliveries from ``queue``, None whenever it is empty (:attr:`drained` set)."""
        # Held-back deliveries stay held when consuming stops: the kit ends a consume
        # whenever its queue is empty and starts it again on the next round, which in
        # production is one consumer running throughout.
        self.drained = False
        while True:
            delivery = self.get(queue)
            self.drained = delivery is None
            yield delivery

    # -- settling -------------------------------------------------------------------------

    def ack(self, delivery: Delivery, *, deferred: bool = False) -> None:
        self._held.pop(delivery.tag, None)

    def requeue(self, delivery: Delivery, *, after_s: float = 0.0) -> None:
        if delivery.tag not in self._held:
            return
        if after_s <= 0:
            self._memory.give_back(self._held.pop(delivery.tag))
            return
        self._paused.append((self._clock() + timedelta(seconds=after_s), delivery.tag))

    @property
    def held_back(self) -> int:
        return len(self._paused)

    def next_release(self) -> datetime | None:
        """When the first held-back delivery goes back to its queue (None: none)."""
        return min((due for due, _ in self._paused), default=None)

    def release_due(self, *, everything: bool = False) -> None:
        if not self._paused:
            return
        now = self._clock()
        due = [tag for at, tag in self._paused if everything or at <= now]
        if not due:
            return
        self._paused = [(at, tag) for at, tag in self._paused if tag not in due]
        self.last_release = time.monotonic()
        for tag in due:
            item = self._held.pop(tag, None)
            if item is not None:
                self._memory.give_back(item)

    def move_to_invalid(self, delivery: Delivery, reason: str) -> None:
        headers = dict(delivery.properties.headers or {})
        headers[protocol.H_ORIGINAL_QUEUE] = delivery.queue
        props = delivery.properties
        self._put_invalid(
            delivery.body,
            invalid_headers(headers, reason),
            content_type=props.content_type,
            message_id=props.message_id,
            correlation_id=props.correlation_id,
            reply_to=props.reply_to,
        )
        self.ack(delivery)

    def publish_invalid(self, body: bytes, headers: dict[str, Any], reason: str) -> None:
        self._put_invalid(body, invalid_headers(headers, reason))

    def _put_invalid(self, body: bytes, headers: dict[str, Any], **props: Any) -> None:
        self._memory.declare(self.invalid_queue)
        message = OutboxMessage.trusted(
            exchange="",
            routing_key=self.invalid_queue,
            body=body,
            headers=headers,
            content_encoding=None,
            message_type=None,
            priority=None,
            expiration_ms=None,
            persistent=True,
            mandatory=True,
            **{k: props.get(k) for k in ("message_id", "correlation_id", "reply_to")},
            content_type=props.get("content_type"),
        )
        self._memory.publish(message)

    # -- the connection -------------------------------------------------------------------

    def idle(self, seconds: float) -> None:
        return None  # nothing sleeps in the kit

    def close(self) -> None:
        """What RabbitMQ does when a consumer's connection ends: every unsettled delivery,
        held back or not, goes back to its queue."""
        self._paused.clear()
        held, self._held = self._held, {}
        for item in sorted(held.values(), key=lambda i: i.seq):
            self._memory.give_back(item)


class UntilDrained(threading.Event):
    """The stop flag of a kit's ``Receiver.consume``: set once ``broker``'s queue had
    nothing ready, so that a consume takes what is there and returns."""

    def __init__(self, broker: MemoryReceiverBroker) -> None:
        super().__init__()
        self._broker = broker

    def is_set(self) -> bool:
        return self._broker.drained
