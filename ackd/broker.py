"""The receiver's RabbitMQ side: one connection, one consuming channel, one confirm channel.

A receiver object is used from one thread; pika's ``BlockingConnection`` is not thread-safe.
Deliveries are acknowledged on the channel they arrived on, and only after the database
transaction that recorded them has committed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from condmsg import protocol as p
from condmsg.amqp import connect
from condmsg.errors import BrokerError
from condmsg.topology import declare_destination, declare_service_queue


@dataclass(frozen=True, slots=True)
class Delivery:
    queue: str
    tag: int
    redelivered: bool
    properties: pika.BasicProperties
    body: bytes

    @property
    def headers(self) -> dict[str, Any]:
        return dict(self.properties.headers or {})


def _delivery(queue: str, method: Any, properties: Any, body: bytes | None) -> Delivery:
    return Delivery(
        queue, int(method.delivery_tag), bool(method.redelivered), properties, body or b""
    )


class Broker:
    """Lazily connected; reconnects on the next call after the connection broke."""

    def __init__(self, amqp_url: str, *, name: str, invalid_queue: str) -> None:
        self.amqp_url = amqp_url
        self.name = name
        self.invalid_queue = invalid_queue
        self._connection: pika.BlockingConnection | None = None
        self._channel: BlockingChannel | None = None
        self._confirm: BlockingChannel | None = None
        self._declared: set[str] = set()
        self._prefetch: int | None = None

    def _open(self) -> BlockingChannel:
        if self._channel is not None and self._channel.is_open:
            return self._channel
        self.close()
        self._connection = connect(self.amqp_url, name=self.name)
        self._channel = self._connection.channel()
        # Declared up front so that operators (and monitoring) see it before anything lands.
        declare_service_queue(self._channel, self.invalid_queue)
        self._declared.clear()
        self._prefetch = None
        return self._channel

    def ensure_queue(self, queue: str) -> None:
        """Declare ``queue`` as a destination queue unless it exists (once per connection)."""
        self._open()
        if queue in self._declared:
            return
        assert self._connection is not None
        declare_destination(self._connection, queue)
        self._declared.add(queue)

    def get(self, queue: str) -> Delivery | None:
        """One message from ``queue`` without acking it, or None if it is empty."""
        self.ensure_queue(queue)
        channel = self._open()
        try:
            method, properties, body = channel.basic_get(queue, auto_ack=False)
        except pika.exceptions.AMQPError as exc:
            self.close()
            raise BrokerError(f"reading from {queue!r} failed: {exc!r}") from None
        if method is None:
            return None
        return _delivery(queue, method, properties, body)

    def consume(
        self, queue: str, *, prefetch: int, inactivity_s: float
    ) -> Generator[Delivery | None, None, None]:
        """Deliveries from ``queue`` (None after ``inactivity_s`` without one).

        Closing the generator cancels the consumer; RabbitMQ requeues what was prefetched
        but not acknowledged.
        """
        self.ensure_queue(queue)
        channel = self._open()
        if self._prefetch != prefetch:
            channel.basic_qos(prefetch_count=prefetch)
            self._prefetch = prefetch
        try:
            for method, properties, body in channel.consume(queue, inactivity_timeout=inactivity_s):
                yield None if method is None else _delivery(queue, method, properties, body)
        finally:
            if channel.is_open:
                channel.cancel()

    def ack(self, delivery: Delivery) -> None:
        self._settle(delivery, requeue=None)

    def requeue(self, delivery: Delivery) -> None:
        self._settle(delivery, requeue=True)

    def _settle(self, delivery: Delivery, *, requeue: bool | None) -> None:
        channel = self._channel
        if channel is None or not channel.is_open:
            # The channel died after the commit: RabbitMQ redelivers the message, and the
            # receiver log recognises it (invariant 4: never processed twice).
            return
        try:
            if requeue is None:
                channel.basic_ack(delivery.tag)
            else:
                channel.basic_nack(delivery.tag, requeue=requeue)
        except pika.exceptions.AMQPError:
            self.close()

    def _confirm_channel(self) -> BlockingChannel:
        """A channel in confirm mode: a publish returns once RabbitMQ has the message."""
        self._open()
        assert self._connection is not None
        if self._confirm is None or not self._confirm.is_open:
            self._confirm = self._connection.channel()
            self._confirm.confirm_delivery()
            declare_service_queue(self._confirm, self.invalid_queue)
        return self._confirm

    def move_to_invalid(self, delivery: Delivery, reason: str) -> None:
        """Republish to the invalid-message queue with the reason, then ack the original."""
        confirm = self._confirm_channel()
        props = delivery.properties
        headers = dict(props.headers or {})
        headers[p.H_REASON] = reason[:1000]
        headers["condmsg-original-queue"] = delivery.queue
        confirm.basic_publish(
            "",
            self.invalid_queue,
            delivery.body,
            pika.BasicProperties(
                content_type=props.content_type,
                message_id=props.message_id,
                correlation_id=props.correlation_id,
                reply_to=props.reply_to,
                headers=headers,
                delivery_mode=pika.DeliveryMode.Persistent,
            ),
        )
        self.ack(delivery)

    def publish_invalid(self, body: bytes, headers: dict[str, Any], reason: str) -> None:
        """Put a message the receiver holds only in its store on the invalid-message queue."""
        confirm = self._confirm_channel()
        confirm.basic_publish(
            "",
            self.invalid_queue,
            body,
            pika.BasicProperties(
                headers={**headers, p.H_REASON: reason[:1000]},
                delivery_mode=pika.DeliveryMode.Persistent,
            ),
        )

    def drop_connection(self) -> None:
        """Close the connection abruptly (tests use it to simulate a crash)."""
        self.close()

    def close(self) -> None:
        connection, self._connection = self._connection, None
        self._channel = self._confirm = None
        if connection is not None and connection.is_open:
            # Closing a broken connection can raise; there is nothing left to save.
            with contextlib.suppress(Exception):
                connection.close()
