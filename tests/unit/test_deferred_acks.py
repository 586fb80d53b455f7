"""The receiver's deferred AMQP acks: batched, never covering a delivery still in use."""

from __future__ import annotations

from typing import Any

import pika

from ackd.broker import Broker, Delivery


class RecordingChannel:
    """Stands in for a pika channel: records what would go to RabbitMQ."""

    is_open = True

    def __init__(self) -> None:
        self.sent: list[tuple[str, int, bool]] = []

    def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        self.sent.append(("ack", delivery_tag, multiple))

    def basic_nack(self, delivery_tag: int, requeue: bool = True) -> None:
        self.sent.append(("nack", delivery_tag, False))


def _broker() -> tuple[Broker, RecordingChannel]:
    broker = Broker("amqp://unused", name="t", invalid_queue="t.invalid")
    channel = RecordingChannel()
    broker._channel = channel  # type: ignore[assignment]
    broker._deferring = True  # as while consume() runs
    return broker, channel


def _deliver(broker: Broker, tag: int) -> Delivery:
    delivery = Delivery("q", tag, False, pika.BasicProperties(), b"")
    return broker._received(delivery)


def test_deferred_acks_go_out_as_one_multiple_ack_when_the_batch_is_full() -> None:
    broker, channel = _broker()
    broker._ack_batch = 3
    deliveries = [_deliver(broker, tag) for tag in (1, 2, 3)]
    for d in deliveries[:2]:
        broker.ack(d, deferred=True)
    assert channel.sent == []
    broker.ack(deliveries[2], deferred=True)
    assert channel.sent == [("ack", 3, True)]


def test_a_multiple_ack_never_covers_a_delivery_still_being_processed() -> None:
    broker, channel = _broker()
    d = {tag: _deliver(broker, tag) for tag in range(1, 6)}
    for tag in (1, 2, 4, 5):  # 3 is still in an open transaction
        broker.ack(d[tag], deferred=True)
    broker.flush_acks()
    assert channel.sent == [("ack", 2, True), ("ack", 4, False), ("ack", 5, False)]
    broker.ack(d[3], deferred=True)
    broker.flush_acks()
    assert channel.sent[-1] == ("ack", 3, True)


def test_immediate_acks_and_requeues_are_sent_at_once_and_settle_the_tag() -> None:
    broker, channel = _broker()
    d = {tag: _deliver(broker, tag) for tag in (1, 2, 3)}
    broker.ack(d[2], deferred=True)
    broker.requeue(d[1])
    broker.ack(d[3])
    assert channel.sent == [("nack", 1, False), ("ack", 3, False)]
    broker.flush_acks()  # 1 and 3 are settled: the owed ack of 2 may cover everything below
    assert channel.sent[-1] == ("ack", 2, True)


def test_a_dropped_connection_forgets_owed_acks_so_rabbitmq_redelivers() -> None:
    broker, channel = _broker()
    broker.ack(_deliver(broker, 1), deferred=True)
    broker.drop_connection()
    assert channel.sent == []
    broker.ack(Delivery("q", 7, False, pika.BasicProperties(), b""), deferred=True)
    assert broker._deferred == []  # a tag of an earlier channel is not acked on a new one


def test_an_old_owed_ack_is_flushed_by_the_next_delivery(monkeypatch: Any) -> None:
    broker, channel = _broker()
    broker.ack(_deliver(broker, 1), deferred=True)
    clock = [1000.0]
    monkeypatch.setattr("ackd.broker.time.monotonic", lambda: clock[0])
    broker._deferred_since = 1000.0
    _deliver(broker, 2)
    assert channel.sent == []
    clock[0] += 1.0
    _deliver(broker, 3)
    assert channel.sent == [("ack", 1, True)]


def test_outside_consume_a_deferrable_ack_goes_out_at_once() -> None:
    broker, channel = _broker()
    broker._deferring = False  # a lone read(): no loop would flush an owed ack
    broker.ack(_deliver(broker, 1), deferred=True)
    assert channel.sent == [("ack", 1, False)]
