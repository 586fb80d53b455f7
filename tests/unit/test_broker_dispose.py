"""``Broker.dispose``: the one broker call that settles a delivery, per :class:`Fate`."""

from __future__ import annotations

from typing import Any

import pika
import pika.exceptions
import pytest

from ackd.broker import Broker, Delivery, Disposal, Fate
from condmsg.core import protocol
from condmsg.core.errors import BrokerError


class RecordingChannel:
    """Stands in for the receiver's pika channels: records what would go to RabbitMQ."""

    is_open = True

    def __init__(self, *, refuse_publish: bool = False) -> None:
        self.sent: list[tuple[Any, ...]] = []
        self._refuse_publish = refuse_publish

    def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        self.sent.append(("ack", delivery_tag, multiple))

    def basic_nack(self, delivery_tag: int, requeue: bool = True) -> None:
        self.sent.append(("nack", delivery_tag, requeue))

    def basic_publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: pika.BasicProperties,
        mandatory: bool = False,
    ) -> None:
        if self._refuse_publish:
            raise pika.exceptions.ChannelClosedByBroker(404, "NOT_FOUND - no queue")
        assert mandatory, "a copy to the invalid queue must come back if it cannot be routed"
        self.sent.append(("publish", routing_key, body, dict(properties.headers or {})))


def _broker(channel: RecordingChannel) -> Broker:
    """A broker whose consuming and confirm channels are ``channel`` (one record, in
    order), while consume() runs (acks may be deferred)."""
    broker = Broker("amqp://unused", name="t", invalid_queue="t.invalid", queue_type="classic")
    broker._connection = object()  # type: ignore[assignment]
    broker._channel = channel  # type: ignore[assignment]
    broker._confirm = channel  # type: ignore[assignment]
    broker._deferring = True
    return broker


def _deliver(broker: Broker, tag: int = 1) -> Delivery:
    headers = {"app": "x"}
    delivery = Delivery("q", tag, False, pika.BasicProperties(headers=headers), b"body")
    return broker._received(delivery)


def test_ack_acknowledges_at_once() -> None:
    channel = RecordingChannel()
    broker = _broker(channel)
    broker.dispose(_deliver(broker), Disposal(Fate.ACK))
    assert channel.sent == [("ack", 1, False)]


def test_ack_deferred_owes_the_ack_until_the_next_flush() -> None:
    channel = RecordingChannel()
    broker = _broker(channel)
    broker.dispose(_deliver(broker), Disposal(Fate.ACK_DEFERRED))
    assert channel.sent == []
    broker.flush_acks()
    assert channel.sent == [("ack", 1, True)]


def test_invalid_copies_the_message_with_its_reason_to_the_invalid_queue_then_acks() -> None:
    channel = RecordingChannel()
    broker = _broker(channel)
    broker.dispose(_deliver(broker), Disposal(Fate.INVALID, "bad token"))
    assert channel.sent == [
        (
            "publish",
            "t.invalid",
            b"body",
            {"app": "x", protocol.H_REASON: "bad token", "condmsg-original-queue": "q"},
        ),
        ("ack", 1, False),
    ]


def test_a_failed_copy_to_the_invalid_queue_raises_and_leaves_the_delivery_unsettled() -> None:
    """Not acked: the caller gives it back to its queue (acceptance requeues it)."""
    channel = RecordingChannel(refuse_publish=True)
    broker = _broker(channel)
    delivery = _deliver(broker)
    with pytest.raises(BrokerError, match=r"to the invalid-message queue 't\.invalid' failed"):
        broker.dispose(delivery, Disposal(Fate.INVALID, "bad token"))
    assert channel.sent == []
    broker.requeue(delivery)
    assert channel.sent == [("nack", 1, True)]


def test_requeue_gives_the_delivery_back_at_once() -> None:
    channel = RecordingChannel()
    broker = _broker(channel)
    broker.dispose(_deliver(broker), Disposal(Fate.REQUEUE))
    assert channel.sent == [("nack", 1, True)]


def test_requeue_after_a_pause_holds_the_delivery_back_until_it_is_due() -> None:
    channel = RecordingChannel()
    broker = _broker(channel)
    broker.dispose(_deliver(broker), Disposal(Fate.REQUEUE, after_s=60))
    assert (channel.sent, broker.held_back) == ([], 1)
    broker.release_due()
    assert channel.sent == []
    broker.release_due(everything=True)
    assert (channel.sent, broker.held_back) == ([("nack", 1, True)], 0)


def test_left_sends_nothing_and_leaves_the_delivery_to_its_transaction() -> None:
    channel = RecordingChannel()
    broker = _broker(channel)
    delivery = _deliver(broker)
    broker.dispose(delivery, Disposal(Fate.LEFT))
    broker.flush_acks()
    assert channel.sent == []
    broker.ack(delivery)  # what the transaction's end does: still unsettled, so it goes out
    assert channel.sent == [("ack", 1, False)]


def test_every_fate_is_covered_here() -> None:
    """A new Fate needs its dispatch tested in this file."""
    tested = {Fate.ACK, Fate.ACK_DEFERRED, Fate.INVALID, Fate.REQUEUE, Fate.LEFT}
    assert set(Fate) == tested
