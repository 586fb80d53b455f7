"""The receiver's RabbitMQ side: one connection, one consuming channel, one confirm channel.

A receiver object is used from one thread; pika's ``BlockingConnection`` is not thread-safe.
Deliveries are acknowledged on the channel they arrived on, and only after the database
transaction that recorded them has committed.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Generator
from dataclasses import dataclass
from enum import Enum
from typing import Any

import pika
import pika.data
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from ackd import field_types
from condmsg.core import protocol
from condmsg.core.errors import BrokerError
from condmsg.runtime.amqp import connect
from condmsg.runtime.settings import destination_queue_type
from condmsg.runtime.topology import declare_destination, declare_service_queue, describe_mode

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Delivery:
    queue: str
    tag: int
    redelivered: bool
    properties: pika.BasicProperties
    body: bytes
    #: Which of the broker's channels it came on (they are numbered as they are opened):
    #: a delivery tag means something only on its own channel.
    channel: int = 0

    @property
    def headers(self) -> dict[str, Any]:
        return dict(self.properties.headers or {})


class Fate(Enum):
    """What becomes of a delivery at the broker once the receiver has taken it."""

    ACK = "ack"  # taken for good: acknowledged now
    ACK_DEFERRED = "ack-deferred"  # its RLOG row drops a redelivery: the ack may be batched
    INVALID = "invalid"  # copied to the invalid-message queue with the reason, then acked
    REQUEUE = "requeue"  # given back to its queue, at once or after a pause
    LEFT = "left"  # nothing now: the app's transaction settles it when it ends


@dataclass(frozen=True, slots=True)
class Disposal:
    """A delivery's :class:`Fate`, with the reason of an invalid one and the pause
    (seconds) before a requeue."""

    fate: Fate
    reason: str = ""
    after_s: float = 0.0


def _delivery(
    queue: str, method: Any, properties: Any, body: bytes | None, channel: int
) -> Delivery:
    return Delivery(
        queue, int(method.delivery_tag), bool(method.redelivered), properties, body or b"", channel
    )


def invalid_headers(headers: dict[str, Any], reason: str) -> dict[str, Any]:
    """The headers of a copy on the invalid-message queue: ``headers`` and the reason (cut
    to 1,000 characters), a float written as its text. Headers that cannot be encoded
    even so are replaced by the reason, saying so, and the original queue if ``headers``
    names it: pika marshals a message whole before it sends anything, so they would
    otherwise keep the message out of the invalid queue for good."""
    try:
        kept = field_types.encodable(headers)
        kept[protocol.H_REASON] = reason[:1000]
        pika.data.encode_table([], kept)
        return dict(kept)
    except Exception as exc:  # whatever a sender put in them costs the headers only
        dropped = f"{reason} (its headers could not be encoded: {type(exc).__name__})"
        fallback: dict[str, Any] = {protocol.H_REASON: dropped[:1000]}
        queue = headers.get(protocol.H_ORIGINAL_QUEUE)
        if isinstance(queue, str):
            fallback[protocol.H_ORIGINAL_QUEUE] = queue
        return fallback


#: At most this many acks are owed at once (fewer with a small prefetch).
ACK_BATCH = 64
#: An owed ack waits at most about this long (seconds) while deliveries keep coming.
ACK_DELAY_S = 0.2


class Broker:
    """Lazily connected; reconnects on the next call after the connection broke."""

    def __init__(
        self, amqp_url: str, *, name: str, invalid_queue: str, queue_type: str | None = None
    ) -> None:
        # A header sent as a double must not pass for an integer (docs/protocol.md).
        field_types.install()
        #: One broker or a cluster's nodes, comma-separated: each (re)connection goes to the
        #: first that answers, so a consumer whose node went resumes on another one.
        self.amqp_url = amqp_url
        #: The destination queues' type (default: ``CONDMSG_DESTINATION_QUEUE_TYPE``).
        self.queue_type = destination_queue_type() if queue_type is None else queue_type
        self._mode_logged = False
        self.name = name
        self.invalid_queue = invalid_queue
        self._connection: pika.BlockingConnection | None = None
        self._channel: BlockingChannel | None = None
        self._confirm: BlockingChannel | None = None
        self._declared: set[str] = set()
        self._prefetch: int | None = None
        #: The number of the channel open now (see :attr:`Delivery.channel`).
        self._generation = 0
        #: Delivery tags received on the channel and not settled yet.
        self._unsettled: set[int] = set()
        #: Tags whose ack is owed but not yet sent (see :meth:`ack`), oldest first.
        self._deferred: list[int] = []
        self._deferred_since = 0.0
        self._ack_batch = ACK_BATCH
        #: Acks are deferred only while :meth:`consume` runs: its idle ticks flush them. A
        #: lone ``read()`` has no loop that would, so its ack goes out at once.
        self._deferring = False
        #: Deliveries held back before their requeue (see :meth:`requeue`): (due, delivery),
        #: due on the monotonic clock.
        self._parked: list[tuple[float, Delivery]] = []
        #: When a held-back delivery was last given back (monotonic; 0: never).
        self.last_release = 0.0

    def _channel_open(self) -> bool:
        return self._channel is not None and self._channel.is_open

    def _open(self) -> BlockingChannel:
        if self._channel is not None and self._channel.is_open:
            return self._channel
        self.close()
        self._connection = connect(self.amqp_url, name=self.name)
        if not self._mode_logged:
            log.info("%s", describe_mode(self._connection, self.queue_type))
            self._mode_logged = True
        self._channel = self._connection.channel()
        self._generation += 1
        # Declared up front so that operators (and monitoring) see it before anything lands.
        declare_service_queue(self._channel, self.invalid_queue)
        self._declared.clear()
        self._prefetch = None
        self._unsettled.clear()
        self._deferred.clear()
        self._parked.clear()  # the old channel's end requeued them
        return self._channel

    def ensure_queue(self, queue: str) -> None:
        """Declare ``queue`` as a destination queue unless it exists (once per connection)."""
        self._open()
        if queue in self._declared:
            return
        assert self._connection is not None
        declare_destination(self._connection, queue, self.queue_type)
        self._declared.add(queue)

    def get(self, queue: str) -> Delivery | None:
        """One message from ``queue`` without acking it, or None if it is empty."""
        self.ensure_queue(queue)
        channel = self._open()
        self.release_due()
        try:
            method, properties, body = channel.basic_get(queue, auto_ack=False)
        except pika.exceptions.AMQPError as exc:
            self.close()
            raise BrokerError(f"reading from {queue!r} failed: {exc!r}") from None
        if method is None:
            self.flush_acks()  # the queue is empty: a good moment to settle
            return None
        return self._received(_delivery(queue, method, properties, body, self._generation))

    def _received(self, delivery: Delivery) -> Delivery:
        self._unsettled.add(delivery.tag)
        self.release_due()
        if self._deferred and time.monotonic() - self._deferred_since > ACK_DELAY_S:
            self.flush_acks()
        return delivery

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
        # Owed acks hold prefetch slots: settle well before the window is used up.
        self._ack_batch = max(1, min(ACK_BATCH, prefetch // 4))
        self._deferring = True
        try:
            for method, properties, body in channel.consume(queue, inactivity_timeout=inactivity_s):
                if method is None:
                    self.release_due()
                    self.flush_acks()
                    yield None
                elif channel is not self._channel or not channel.is_open:
                    # pika hands out what it had buffered after the connection is gone:
                    # those deliveries are requeued already and cannot be settled here.
                    raise BrokerError("lost the connection to RabbitMQ while consuming")
                else:
                    delivery = _delivery(queue, method, properties, body, self._generation)
                    yield self._received(delivery)
        except ValueError as exc:
            # When a node goes, pika's blocking consume can fail inside its I/O loop with
            # a ValueError ("Timeout closed before call") instead of a connection error:
            # a lost connection all the same, which the caller rides out by reconnecting.
            raise BrokerError(f"lost the connection to RabbitMQ: {exc}") from exc
        finally:
            self._deferring = False
            # Held-back deliveries go back now, their pause cut short: nothing of this
            # consumer would return them later, and meanwhile no other consumer gets them.
            self.release_due(everything=True)
            self.flush_acks()
            self._ack_batch = ACK_BATCH
            if channel.is_open:
                channel.cancel()

    def ack(self, delivery: Delivery, *, deferred: bool = False) -> None:
        """Acknowledge ``delivery``; with ``deferred``, possibly later, batched.

        Deferring is for deliveries whose effect the receiver log already records: a crash
        before the ack makes RabbitMQ redeliver them, and the RLOG drops the redelivery.
        It happens only while :meth:`consume` runs; owed acks go out as one ``multiple``
        ack when :data:`ACK_BATCH` are owed, when the queue is idle (every inactivity
        tick), after :data:`ACK_DELAY_S` while deliveries keep coming, and when consuming
        stops or the connection closes.
        """
        if not (deferred and self._deferring):
            self._settle(delivery, requeue=None)
            return
        if not self._owns(delivery):
            return  # from an earlier channel: RabbitMQ has requeued it already
        self._unsettled.discard(delivery.tag)
        if not self._deferred:
            self._deferred_since = time.monotonic()
        self._deferred.append(delivery.tag)
        if len(self._deferred) >= self._ack_batch:
            self.flush_acks()

    def requeue(self, delivery: Delivery, *, after_s: float = 0.0) -> None:
        """Give ``delivery`` back to its queue, at once or after ``after_s`` seconds.

        A delivery held back stays unacked on this channel meanwhile: RabbitMQ gives it to
        no other consumer and does not redeliver it here, so nobody spins on it, and this
        thread goes on with other messages (nothing sleeps). :meth:`release_due` requeues
        it when due; every read, consume tick and :meth:`close` calls it. Should the
        connection end first, RabbitMQ requeues it at once.
        """
        if after_s <= 0:
            self._settle(delivery, requeue=True)
            return
        if self._owns(delivery):
            self._parked.append((time.monotonic() + after_s, delivery))

    @property
    def held_back(self) -> int:
        """How many deliveries wait for their requeue."""
        return len(self._parked)

    def release_due(self, *, everything: bool = False) -> None:
        """Requeue the held-back deliveries whose pause is over (all, with ``everything``)."""
        if not self._parked:
            return
        now = time.monotonic()
        due = [d for at, d in self._parked if everything or at <= now]
        if not due:
            return
        self._parked = [(at, d) for at, d in self._parked if not (everything or at <= now)]
        self.last_release = now
        for delivery in due:
            self._settle(delivery, requeue=True)

    def flush_acks(self) -> None:
        """Send the owed acks: one ``multiple`` ack for those below every unsettled tag
        (it must not cover a delivery still being processed), single acks for the rest."""
        if not self._deferred:
            return
        owed, self._deferred = sorted(self._deferred), []
        channel = self._channel
        if channel is None or not channel.is_open:
            return  # redelivered later and dropped by the RLOG
        lowest_open = min(self._unsettled, default=owed[-1] + 1)
        covered = [tag for tag in owed if tag < lowest_open]
        try:
            if covered:
                channel.basic_ack(covered[-1], multiple=True)
            for tag in owed[len(covered) :]:
                channel.basic_ack(tag)
        except pika.exceptions.AMQPError:
            self.close()

    def _owns(self, delivery: Delivery) -> bool:
        """True if ``delivery`` came on the channel open now and is not settled yet."""
        return delivery.channel == self._generation and delivery.tag in self._unsettled

    def _settle(self, delivery: Delivery, *, requeue: bool | None) -> None:
        if not self._owns(delivery):
            # Settled already, or from an earlier channel (whose end requeued it): a second
            # ack or nack of a tag is a channel error that would close the channel.
            return
        self._unsettled.discard(delivery.tag)
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

    def dispose(self, delivery: Delivery, disposal: Disposal) -> None:
        """Settle ``delivery`` as ``disposal`` says: the one broker call for its fate."""
        fate = disposal.fate
        if fate is Fate.ACK or fate is Fate.ACK_DEFERRED:
            self.ack(delivery, deferred=fate is Fate.ACK_DEFERRED)
        elif fate is Fate.INVALID:
            self.move_to_invalid(delivery, disposal.reason)
        elif fate is Fate.REQUEUE:
            self.requeue(delivery, after_s=disposal.after_s)

    def move_to_invalid(self, delivery: Delivery, reason: str) -> None:
        """Republish to the invalid-message queue with the reason, then ack the original."""
        if not self._owns(delivery) or not self._channel_open():
            # Its channel is gone and RabbitMQ gives it again: copying it now would leave
            # two copies in the invalid queue.
            raise BrokerError("lost the connection to RabbitMQ before moving a message")
        headers = dict(delivery.properties.headers or {})
        headers[protocol.H_ORIGINAL_QUEUE] = delivery.queue
        self._publish_invalid_copy(delivery, invalid_headers(headers, reason))
        self.ack(delivery)

    def _publish_invalid_copy(self, delivery: Delivery, headers: dict[str, Any]) -> None:
        """Raises :class:`BrokerError` if the broker fails (the message did not): the
        caller gives the delivery back to its queue."""
        props = delivery.properties
        try:
            self._publish_to_invalid_queue(
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
        except pika.exceptions.AMQPError as exc:
            raise BrokerError(
                f"copying message {props.message_id} from {delivery.queue!r} to the "
                f"invalid-message queue {self.invalid_queue!r} failed: {exc!r}"
            ) from exc

    def publish_invalid(self, body: bytes, headers: dict[str, Any], reason: str) -> None:
        """Put a message the receiver holds only in its store on the invalid-message queue
        (an error leaves it in the store: the caller's transaction rolls back)."""
        self._publish_to_invalid_queue(
            body,
            pika.BasicProperties(
                headers=invalid_headers(headers, reason), delivery_mode=pika.DeliveryMode.Persistent
            ),
        )

    def _publish_to_invalid_queue(self, body: bytes, properties: pika.BasicProperties) -> None:
        """Publish with a confirm, ``mandatory``: a queue deleted while the receiver runs
        would otherwise take the message into nothing while the broker confirms it. A
        returned message raises (pika's ``UnroutableError``) and the next publish opens a
        channel that declares the queue again."""
        try:
            self._confirm_channel().basic_publish(
                "", self.invalid_queue, body, properties, mandatory=True
            )
        except pika.exceptions.UnroutableError:
            channel, self._confirm = self._confirm, None
            if channel is not None and channel.is_open:
                channel.close()
            raise

    def idle(self, seconds: float) -> None:
        """Let ``seconds`` pass while the connection's heartbeats are answered (a
        consumer that pauses for longer than the heartbeat timeout would lose it)."""
        connection = self._connection
        if connection is None or not connection.is_open:
            time.sleep(seconds)
            return
        try:
            connection.sleep(seconds)
        except Exception:  # whatever the connection raised, the next use reconnects
            self.close()

    def drop_connection(self) -> None:
        """Close the connection abruptly, owed acks unsent (tests simulate a crash)."""
        self._deferred.clear()
        self.close()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.release_due(everything=True)
        with contextlib.suppress(Exception):
            self.flush_acks()
        connection, self._connection = self._connection, None
        self._channel = self._confirm = None
        if connection is not None and connection.is_open:
            # Closing a broken connection can raise; there is nothing left to save.
            with contextlib.suppress(Exception):
                connection.close()
