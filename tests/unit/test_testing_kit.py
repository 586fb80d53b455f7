"""The test kit's own mechanics: the virtual clock that retry pauses and expiries obey,
receivers that go away, the in-memory broker's queue order. (What the kit decides is held
to the services by tests/integration/kit/test_kit_fidelity.py; the paper's examples run from
docs/testing.md.)"""

from __future__ import annotations

from datetime import timedelta

import pytest

from condmsg import Destination, Verdict
from condmsg.core.errors import ConfigError
from condmsg.testing import Kit, KitReceiver, MemoryBroker, VirtualClock
from outbox.message import OutboxMessage

MINUTE = timedelta(minutes=1)


class Refused(Exception):
    pass


def _take_and_fail(rx: KitReceiver) -> None:
    with rx.transaction() as tx:
        assert tx.read("q") is not None
        raise Refused


def test_a_rolled_back_message_comes_back_after_its_retry_pause_in_virtual_time(
    condmsg_kit: Kit,
) -> None:
    kit = condmsg_kit
    rx = kit.receiver("clerk", retry_backoff=10 * MINUTE, retry_backoff_max=10 * MINUTE)
    kit.send(b"invoice", Destination("q", process_within=timedelta(hours=1)))
    with pytest.raises(Refused):
        _take_and_fail(rx)
    kit.advance(minutes=9)
    with rx.transaction() as tx:
        assert tx.read("q") is None  # still held back
    kit.advance(minutes=1)
    with rx.transaction() as tx:
        again = tx.read("q")
    assert again is not None and again.redelivered


def test_a_consumer_that_fails_is_retried_until_the_message_goes_to_the_invalid_queue(
    condmsg_kit: Kit,
) -> None:
    kit = condmsg_kit
    rx = kit.receiver("clerk", max_attempts=3, retry_backoff=MINUTE, retry_backoff_max=MINUTE)
    calls = []

    def fails(message: object, session: object) -> None:
        calls.append(kit.now())
        raise Refused

    rx.consume("q", fails)
    cm = kit.send(b"invoice", Destination("q", process_within=timedelta(hours=1)))
    kit.advance(minutes=10)
    # Each pause is a minute (the kit acts on it a microsecond after it ends).
    assert [round((c - calls[0]).total_seconds(), 3) for c in calls] == [0, 60, 120]
    assert len(kit.invalid()) == 1
    kit.advance(hours=1)
    assert kit.verdict(cm) is Verdict.VIOLATED


def test_a_receiver_away_takes_nothing_and_what_it_held_goes_back(condmsg_kit: Kit) -> None:
    kit = condmsg_kit
    rx = kit.receiver("clerk")
    got = []
    rx.consume("q", lambda message, session: got.append(message.body))
    rx.go_away()
    cm = kit.send(b"invoice", Destination("q", pickup_within=timedelta(hours=1)))
    kit.advance(minutes=30)
    assert got == [] and len(kit.queued("q")) == 1
    with pytest.raises(ConfigError, match="away"):
        rx.read("q")
    rx.come_back()
    assert got == [b"invoice"]
    assert kit.verdict(cm) is Verdict.SATISFIED


def test_an_expired_copy_is_never_read(condmsg_kit: Kit) -> None:
    kit = condmsg_kit
    cm = kit.send(b"offer", Destination("q", pickup_within=timedelta(hours=2), expiry=MINUTE))
    kit.advance(minutes=2)
    assert kit.receiver("buyer").read("q") is None
    kit.advance(hours=2)
    assert kit.verdict(cm) is Verdict.VIOLATED


def test_things_done_together_settle_once_at_the_end(condmsg_kit: Kit) -> None:
    kit = condmsg_kit
    with kit.together():
        cm = kit.send(b"x", Destination("q", pickup_within=MINUTE))
        assert kit.queued("q") == []  # not relayed yet
    assert kit.receiver("r").read("q") is not None
    assert kit.verdict(cm) is Verdict.SATISFIED


def test_the_clock_never_goes_back() -> None:
    clock = VirtualClock()
    clock.advance(MINUTE)
    with pytest.raises(ConfigError):
        clock.set(clock.start)
    with pytest.raises(ConfigError):
        clock.advance(-MINUTE)
    assert clock.elapsed == MINUTE


def _message(body: bytes, priority: int | None = None) -> OutboxMessage:
    return OutboxMessage(exchange="", routing_key="q", body=body, priority=priority)


def test_the_broker_hands_out_the_highest_priority_first_in_order_within_one() -> None:
    broker = MemoryBroker(VirtualClock())
    for body, priority in ((b"a", None), (b"b", 10), (b"c", None), (b"d", 10)):
        assert broker.publish(_message(body, priority)) is None
    taken = broker.take("q")
    assert taken is not None and taken.message.body == b"b"
    broker.give_back(taken)
    assert [m.body for m in broker.peek("q")] == [b"b", b"d", b"a", b"c"]
    again = broker.take("q")
    assert again is not None and again.redelivered


def test_the_broker_returns_what_only_another_exchange_could_route() -> None:
    broker = MemoryBroker(VirtualClock())
    message = OutboxMessage(exchange="news", routing_key="sport", body=b"x")
    assert broker.publish(message) is not None
    assert (
        broker.publish(OutboxMessage(exchange="news", routing_key="s", body=b"x", mandatory=False))
        is None
    )


def test_a_large_payload_travels_as_a_sequence_and_is_read_whole() -> None:
    with Kit(part_bytes=1000) as kit:
        payload = bytes(range(256)) * 10
        cm = kit.send(payload, Destination("q", pickup_within=MINUTE))
        assert len(kit.queued("q")) == 3
        message = kit.receiver("r").read("q")
        assert message is not None and message.body == payload
        assert kit.verdict(cm) is Verdict.SATISFIED


def test_an_incomplete_sequence_goes_to_the_invalid_queue_after_its_timeout() -> None:
    with Kit(part_bytes=1000) as kit:
        rx = kit.receiver("r", sequence_timeout=timedelta(minutes=5))
        kit.send(bytes(2500), Destination("q", pickup_within=timedelta(hours=1)))
        assert kit.broker.take("q") is not None  # a part lost on the way
        assert rx.read("q") is None  # the other two are stored
        kit.advance(minutes=4)
        assert rx.read("q") is None and kit.invalid() == []
        kit.advance(minutes=2)
        assert rx.read("q") is None
        assert len(kit.invalid()) == 2
