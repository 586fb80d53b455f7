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
from sqlalchemy.orm import Session

from ackd import sequences
from ackd import tables as ackd_tables
from ackd.broker import Delivery
from condmsg import Destination, tables
from condmsg.core import protocol
from tests.integration.condmsg_helpers import get_all, publish_copy
from tests.waiting import wait_for

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


@pytest.mark.parametrize("transactional", [False, True], ids=["read", "transaction"])
def test_a_sequence_whose_parts_disagree_on_its_size_goes_to_the_invalid_queue_part_by_part(
    pg_url: str, unique_name: str, make_receiver: Any, channel: Any, transactional: bool
) -> None:
    """Parts 1 and 2 say the sequence has 2 parts, part 3 says 3: once parts 1 and 2 are
    stored the store holds a 'complete' sequence of 2, and taking it takes part 3 too.
    None of them is dropped: each goes to the invalid queue with a reason naming the
    disagreement, and the store keeps nothing of them."""
    receiver = make_receiver(pg_url)
    queue = f"{unique_name}.q"
    receiver._broker.ensure_queue(queue)
    publish_copy(
        channel,
        cm_id=str(uuid.uuid4()),
        condition=Destination(queue, pickup_within=timedelta(seconds=30)),
        sender="s",
        sent_at=datetime.now(UTC),
        body=b"a" * 10 + b"b" * 10 + b"c" * 10,
        part_bytes=10,
    )
    arrived = sorted(get_all(channel, queue), key=lambda m: -m[0].headers[protocol.H_SEQ_POS])
    assert [props.headers[protocol.H_SEQ_POS] for props, _ in arrived] == [2, 1, 0]
    seq_id = arrived[0][0].headers[protocol.H_SEQ_ID]
    # Part 3 first, so that it is stored before parts 1 and 2 complete a sequence of 2.
    for props, body in [arrived[0], arrived[2], arrived[1]]:
        headers = dict(props.headers)
        if headers[protocol.H_SEQ_POS] != 2:
            headers[protocol.H_SEQ_SIZE] = 2
        channel.basic_publish(
            "",
            queue,
            body,
            pika.BasicProperties(headers=headers, reply_to="r", message_id=props.message_id),
        )

    if transactional:
        with receiver.transaction() as tx:
            assert tx.read(queue, timeout=1.0) is None
    else:
        assert receiver.read(queue, timeout=1.0) is None
    assert receiver.stats.parts == 3
    moved = wait_for(lambda: get_all(channel, receiver.invalid_queue))
    disagreement = (
        f"inconsistent sequence {seq_id}: its parts disagree on its size (parts 1, 2: 2; part 3: 3)"
    )
    assert sorted((props.headers[protocol.H_REASON], body) for props, body in moved) == [
        (f"{disagreement}; this is part 1 of 2", b"a" * 10),
        (f"{disagreement}; this is part 2 of 2", b"b" * 10),
        (f"{disagreement}; this is part 3 of 3", b"c" * 10),
    ]
    assert receiver.stats.invalid == 1
    with receiver.engine.connect() as conn:
        stored = conn.execute(sa.select(sa.func.count()).select_from(ackd_tables.sequence_parts))
        assert stored.scalar_one() == 0
    assert get_all(channel, queue, settle_s=0.1) == []


def test_taken_parts_that_do_not_make_one_whole_come_back_for_the_invalid_queue(
    sqlite_url: str, make_receiver: Any
) -> None:
    """What a take returns when the rows it deleted are not positions 0 to size - 1 of one
    size: every part, with why, never nothing."""
    receiver = make_receiver(sqlite_url)

    def store(seq_id: str, *positions: tuple[int, int]) -> None:
        with Session(receiver.engine) as session, session.begin():
            for position, size in positions:
                delivery = Delivery("q", position + 1, False, pika.BasicProperties(), b"p")
                row = sequences.part_row(
                    delivery, seq_id=seq_id, position=position, size=size, now=datetime.now(UTC)
                )
                receiver.store.store_part(session, row)

    def take(seq_id: str) -> Any:
        with Session(receiver.engine) as session, session.begin():
            return sequences.take(session, seq_id)

    store("whole", (0, 2), (1, 2))
    assert isinstance(take("whole"), sequences.Assembled)
    assert take("whole") is None  # taken already
    store("mixed", (0, 3), (1, 2), (2, 3))
    mixed = take("mixed")
    assert isinstance(mixed, sequences.Discordant)
    assert mixed.reason == (
        "inconsistent sequence mixed: its parts disagree on its size (part 2: 2; parts 1, 3: 3)"
    )
    assert [(p, s) for p, s, _, _ in mixed.parts] == [(0, 3), (1, 2), (2, 3)]
    store("short", (0, 3), (2, 3))
    short = take("short")
    assert isinstance(short, sequences.Discordant)
    assert short.reason == "incomplete sequence short: 2 of 3 parts when taken"
