"""Message Sequences: a payload too large for one message is sent in parts and reassembled
by whichever competing consumer completes it; an incomplete sequence goes to the invalid
queue after its timeout."""

from __future__ import annotations

import os
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pika
import pytest
import sqlalchemy as sa

from condmsg import Destination, tables
from condmsg.core import protocol
from tests.waiting import wait_for

from .condmsg_helpers import get_all, publish_copy

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


def _name(unique_name: str) -> str:
    return unique_name.replace(".", "-")


def _relay(endpoint: Any) -> None:
    with endpoint.relay() as relay:
        relay.drain(10)


def test_a_10_mib_payload_round_trips_as_a_sequence_through_two_competing_consumers(
    pg_url: str, unique_name: str, make_sender: Any, make_receiver: Any, channel: Any
) -> None:
    name = _name(unique_name)
    sender = make_sender(pg_url, name)
    queue = f"{unique_name}.q"
    payload = os.urandom(10 * 1024 * 1024)
    cm_id = sender.send(payload, Destination(queue, process_within=timedelta(seconds=60)))
    with sender.engine.connect() as conn:
        assert conn.execute(sa.select(tables.copies.c.parts)).scalar_one() == 10
    consumers = [make_receiver(pg_url, f"worker-{i}", poll_interval_s=0.01) for i in (1, 2)]
    for consumer in consumers:
        consumer._broker.ensure_queue(queue)
    got: list[Any] = []
    stop = threading.Event()

    def work(receiver: Any) -> None:
        while not stop.is_set():
            with receiver.transaction() as tx:
                message = tx.read(queue, timeout=0.2)
                if message is not None:
                    got.append(message)

    threads = [threading.Thread(target=work, args=(c,), daemon=True) for c in consumers]
    for thread in threads:
        thread.start()
    _relay(sender)
    wait_for(lambda: got, timeout=60)
    stop.set()
    for thread in threads:
        thread.join(10)
    assert len(got) == 1
    assert (got[0].cm_id, got[0].payload) == (cm_id, payload)
    assert sum(c.stats.parts for c in consumers) == 10
    assert all(c.stats.parts > 0 for c in consumers), [c.stats.parts for c in consumers]
    for consumer in consumers:
        _relay(consumer)
    acks = [
        protocol.AckMessage.from_json(body)
        for _, body in get_all(channel, protocol.ack_queue(name))
    ]
    assert [(a.cm_id, a.kind.value) for a in acks] == [(cm_id, "commit")]


def test_an_incomplete_sequence_goes_to_the_invalid_queue_after_the_timeout(
    sqlite_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    receiver = make_receiver(sqlite_url, sequence_timeout=timedelta(seconds=1))
    queue = f"{unique_name}.q"
    receiver._broker.ensure_queue(queue)
    publish_copy(
        channel,
        cm_id=str(uuid.uuid4()),
        condition=Destination(queue, pickup_within=timedelta(seconds=30)),
        sender="s",
        sent_at=datetime.now(UTC),
        body=b"a" * 30,
        part_bytes=10,
    )
    # Only parts 0 and 1 of 3 arrive: drop part 2 from the queue first.
    arrived = get_all(channel, queue)
    assert len(arrived) == 3
    for props, body in arrived:
        if props.headers[protocol.H_SEQ_POS] != 2:
            channel.basic_publish(
                "", queue, body, pika.BasicProperties(headers=props.headers, reply_to="r")
            )
    assert receiver.read(queue, timeout=0.5) is None
    assert receiver.stats.parts == 2
    moved = wait_for(
        lambda: receiver.read(queue, timeout=0.3) or get_all(channel, receiver.invalid_queue),
        timeout=15,
    )
    assert len(moved) == 2
    assert all("incomplete sequence" in props.headers[protocol.H_REASON] for props, _ in moved)
