"""The receiver's RabbitMQ side for asyncio applications, on aio-pika.

:class:`AsyncBroker` is :class:`ackd.broker.Broker` with its I/O replaced and nothing else:
the books of what is unsettled, owed, held back for a retry, and which channel a delivery
came on stay the sync broker's own, and so does every decision of what becomes of a
delivery (:meth:`Broker.dispose`, :meth:`Broker.requeue`, :meth:`Broker.move_to_invalid`).

The receive path's sync code (acceptance, RLOG decisions, settlement) runs in a greenlet
(SQLAlchemy's ``greenlet_spawn``) on the event loop's thread; where it calls the broker,
the methods below ``await`` aio-pika through ``await_only``, so the loop serves other tasks
during each broker round trip exactly as it does during each database round trip. Called
outside such a greenlet they raise: every entry of :class:`~ackd.async_receiver.AsyncReceiver`
goes through one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import aio_pika
import aiormq.exceptions
import pika
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractIncomingMessage,
    AbstractQueue,
)
from sqlalchemy.util import await_only

from ackd.broker import Broker, Delivery
from condmsg.core.errors import BrokerError
from condmsg.runtime.topology import QUORUM, destination_arguments
from condmsg.sending.async_broker import CONNECTION_ERRORS, connect

log = logging.getLogger(__name__)

#: What settling a delivery can raise. Only the channel can fail an ack or a nack, and a
#: frame written as the connection goes fails with whatever aiormq's writer was told
#: (a bare ``Exception`` among them): the delivery comes again, and the RLOG drops it.
SETTLE_ERRORS = (Exception,)

#: What a consumer's inbox holds: a delivery, or the error that ended the connection.
InboxItem = Delivery | BaseException


def _properties(message: AbstractIncomingMessage) -> pika.BasicProperties:
    """The properties of an aio-pika delivery as the sync receive path reads them."""
    return pika.BasicProperties(
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        headers=dict(message.headers or {}),  # type: ignore[arg-type]
        delivery_mode=message.delivery_mode.value if message.delivery_mode else None,
        priority=message.priority,
        correlation_id=message.correlation_id,
        reply_to=message.reply_to,
        message_id=message.message_id,
        type=message.type,
        user_id=message.user_id,
        app_id=message.app_id,
    )


class AsyncBroker(Broker):
    """One aio-pika connection with a consuming channel and a confirm channel; lazily
    connected, reconnected on the next call after the connection broke."""

    def __init__(self, amqp_url: str, *, name: str, invalid_queue: str) -> None:
        super().__init__(amqp_url, name=name, invalid_queue=invalid_queue)
        self._aio_connection: AbstractConnection | None = None
        self._aio_channel: AbstractChannel | None = None
        self._aio_confirm: AbstractChannel | None = None
        self._queues: dict[str, AbstractQueue] = {}
        #: The aio-pika message of each unsettled delivery tag of the open channel.
        self._messages: dict[int, AbstractIncomingMessage] = {}
        self._consumer: tuple[AbstractQueue, str] | None = None
        self._opening = asyncio.Lock()
        #: Tags the consumer received that the consume loop has not taken yet.
        self._in_inbox: set[int] = set()

    # -- connection ---------------------------------------------------------------------

    def _channel_open(self) -> bool:
        channel = self._aio_channel
        return channel is not None and not channel.is_closed

    def _open_async(self) -> AbstractChannel:
        if self._aio_channel is not None and not self._aio_channel.is_closed:
            return self._aio_channel
        # Tasks of one loop share the receiver: the first to find the channel gone opens
        # the next one, the others wait for it (two would each open a connection).
        await_only(self._opening.acquire())
        try:
            if self._aio_channel is not None and not self._aio_channel.is_closed:
                return self._aio_channel
            return self._reopen()
        finally:
            self._opening.release()

    def _reopen(self) -> AbstractChannel:
        self.close()
        self._aio_connection = await_only(connect(self.amqp_url, name=self.name))
        try:
            channel = await_only(self._aio_connection.channel(publisher_confirms=False))
            # Declared up front so that operators (and monitoring) see it before anything lands.
            self._declare(channel, self.invalid_queue, dict(QUORUM))
        except CONNECTION_ERRORS as exc:
            raise BrokerError(f"opening a channel on RabbitMQ failed: {exc!r}") from exc
        self._aio_channel = channel
        self._generation += 1
        self._declared.clear()
        self._queues.clear()
        self._prefetch = None
        self._unsettled.clear()
        self._messages.clear()
        self._in_inbox.clear()
        self._deferred.clear()
        self._parked.clear()  # the old channel's end requeued them
        return channel

    def _declare(self, channel: AbstractChannel, name: str, arguments: dict[str, Any]) -> None:
        try:
            await_only(channel.declare_queue(name, durable=True, arguments=arguments))
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            # Declared before with other arguments: used as it is, as the sync receiver
            # does. The refusal closed the channel; the next call opens another.
            log.warning("queue %s is used as it is: %s", name, exc)

    def ensure_queue(self, queue: str) -> None:
        """Declare ``queue`` as a destination queue unless it exists (once per connection)."""
        channel = self._open_async()
        if queue in self._queues:
            return
        try:
            self._declare(channel, queue, dict(destination_arguments(self.queue_type)))
            if channel.is_closed:  # refused above: look the queue up on a new channel
                channel = self._open_async()
            self._queues[queue] = await_only(channel.get_queue(queue, ensure=False))
        except CONNECTION_ERRORS as exc:
            self.close()
            raise BrokerError(f"declaring {queue!r} failed: {exc!r}") from exc
        self._declared.add(queue)

    # -- receiving ----------------------------------------------------------------------

    def get(self, queue: str) -> Delivery | None:
        """One message from ``queue`` without acking it, or None if it is empty."""
        self.ensure_queue(queue)
        self.release_due()
        try:
            message = await_only(self._queues[queue].get(no_ack=False, fail=False))
        except CONNECTION_ERRORS as exc:
            self.close()
            raise BrokerError(f"reading from {queue!r} failed: {exc!r}") from None
        if message is None:
            self.flush_acks()  # the queue is empty: a good moment to settle
            return None
        return self._received(self._delivery(queue, message))

    def _delivery(self, queue: str, message: AbstractIncomingMessage) -> Delivery:
        tag = int(message.delivery_tag or 0)
        self._messages[tag] = message
        return Delivery(
            queue,
            tag,
            bool(message.redelivered),
            _properties(message),
            message.body,
            self._generation,
        )

    def start_consuming(
        self, queue: str, prefetch: int, inbox: Callable[[InboxItem], None]
    ) -> None:
        """Hand each delivery of ``queue`` to ``inbox``, and the error that ends the
        connection (or the channel) as its last item; :meth:`stop_consuming` cancels."""
        self.ensure_queue(queue)
        channel = self._open_async()
        generation = self._generation
        try:
            if self._prefetch != prefetch:
                await_only(channel.set_qos(prefetch_count=prefetch))
                self._prefetch = prefetch
            # Owed acks hold prefetch slots: settle well before the window is used up.
            self._ack_batch = max(1, min(64, prefetch // 4))
            self._deferring = True

            def closed(_sender: object, exc: BaseException | None = None) -> None:
                inbox(exc or BrokerError("lost the connection to RabbitMQ while consuming"))

            channel.close_callbacks.add(closed)

            async def deliver(message: AbstractIncomingMessage) -> None:
                if generation != self._generation:
                    return  # buffered from a channel that is gone: requeued already
                delivery = self._delivery(queue, message)
                self._unsettled.add(delivery.tag)
                self._in_inbox.add(delivery.tag)
                inbox(delivery)

            source = self._queues[queue]
            tag = await_only(source.consume(deliver, no_ack=False))
        except CONNECTION_ERRORS as exc:
            self.close()
            raise BrokerError(f"consuming {queue!r} failed: {exc!r}") from exc
        self._consumer = (source, tag)

    def received(self, delivery: Delivery) -> Delivery:
        """A delivery taken from the consumer's inbox: held-back deliveries due now are
        given back and owed acks sent if they waited long enough (the sync consumer's
        bookkeeping per delivery)."""
        self._in_inbox.discard(delivery.tag)
        return self._received(delivery)

    def stop_consuming(self) -> None:
        """Cancel the consumer; RabbitMQ requeues what was prefetched and not acked."""
        self._deferring = False
        consumer, self._consumer = self._consumer, None
        # Held-back deliveries go back now, their pause cut short: nothing of this
        # consumer would return them later, and meanwhile no other consumer gets them.
        self.release_due(everything=True)
        self.flush_acks()
        self._ack_batch = 64
        if consumer is None or not self._channel_open():
            return
        try:
            await_only(consumer[0].cancel(consumer[1]))
            # What the consumer received and nobody took stays unacked on this channel
            # after the cancel, where no other consumer can have it: give it back (as
            # pika's blocking ``cancel`` does).
            untaken, self._in_inbox = self._in_inbox, set()
            for tag in sorted(untaken):
                message = self._messages.get(tag)
                if message is not None and tag in self._unsettled:
                    self._unsettled.discard(tag)
                    del self._messages[tag]
                    await_only(message.nack(requeue=True))
        except SETTLE_ERRORS:
            self.close()

    # -- settling -----------------------------------------------------------------------

    def _settle(self, delivery: Delivery, *, requeue: bool | None) -> None:
        if not self._owns(delivery):
            # Settled already, or from an earlier channel (whose end requeued it).
            return
        self._unsettled.discard(delivery.tag)
        message = self._messages.pop(delivery.tag, None)
        if message is None or not self._channel_open():
            # The channel died after the commit: RabbitMQ redelivers the message, and the
            # receiver log recognises it (invariant 4: never processed twice).
            return
        try:
            if requeue is None:
                await_only(message.ack())
            else:
                await_only(message.nack(requeue=requeue))
        except SETTLE_ERRORS:
            self.close()

    def flush_acks(self) -> None:
        """Send the owed acks: one ``multiple`` ack for those below every unsettled tag,
        single acks for the rest (as :meth:`Broker.flush_acks`)."""
        if not self._deferred:
            return
        owed, self._deferred = sorted(self._deferred), []
        messages = [self._messages.pop(tag, None) for tag in owed]
        if not self._channel_open():
            return  # redelivered later and dropped by the RLOG
        lowest_open = min(self._unsettled, default=owed[-1] + 1)
        covered = sum(1 for tag in owed if tag < lowest_open)
        try:
            last_covered = messages[covered - 1] if covered else None
            if last_covered is not None:
                await_only(last_covered.ack(multiple=True))
            for message in messages[covered:]:
                if message is not None:
                    await_only(message.ack())
        except SETTLE_ERRORS:
            self.close()

    def _publish_to_invalid_queue(self, body: bytes, properties: pika.BasicProperties) -> None:
        """Publish with a confirm, ``mandatory``: a returned message raises, and the next
        publish opens a channel that declares the queue again."""
        self._open_async()
        assert self._aio_connection is not None
        try:
            if self._aio_confirm is None or self._aio_confirm.is_closed:
                confirm = await_only(self._aio_connection.channel(on_return_raises=True))
                self._declare(confirm, self.invalid_queue, dict(QUORUM))
                self._aio_confirm = confirm
            message = aio_pika.Message(
                body,
                headers=dict(properties.headers or {}),  # type: ignore[arg-type]
                content_type=properties.content_type,
                message_id=properties.message_id,
                correlation_id=properties.correlation_id,
                reply_to=properties.reply_to,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            await_only(
                self._aio_confirm.default_exchange.publish(
                    message, self.invalid_queue, mandatory=True
                )
            )
        except Exception as exc:
            channel, self._aio_confirm = self._aio_confirm, None
            # A frame written as the connection goes fails with whatever aiormq's writer
            # was told; anything else with the channel still open is the message's own
            # (its headers, say), which must not pass for an outage.
            lost = channel is None or channel.is_closed or not self._channel_open()
            if not lost and not isinstance(
                exc, (aio_pika.exceptions.DeliveryError, *CONNECTION_ERRORS)
            ):
                raise
            if channel is not None and not channel.is_closed:
                with contextlib.suppress(Exception):
                    await_only(channel.close())
            raise BrokerError(
                f"publishing to the invalid-message queue {self.invalid_queue!r} failed: {exc!r}"
            ) from exc

    # -- life ---------------------------------------------------------------------------

    def idle(self, seconds: float) -> None:
        """Let ``seconds`` pass without holding the event loop."""
        await_only(asyncio.sleep(seconds))

    def close(self) -> None:
        try:
            self.release_due(everything=True)
            self.flush_acks()
        except Exception:  # a broken connection: RabbitMQ requeues what it held
            log.debug("settling before closing failed", exc_info=True)
        connection, self._aio_connection = self._aio_connection, None
        self._aio_channel = self._aio_confirm = None
        self._consumer = None
        self._messages.clear()
        if connection is not None and not connection.is_closed:
            try:
                await_only(connection.close())
            except Exception:  # closing a broken connection: nothing left to save
                log.debug("closing the connection failed", exc_info=True)
