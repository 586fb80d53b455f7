"""Cancel-out through the receiver log (DESIGN invariant 3), sequential and raced."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from ackd.tables import rlog
from condmsg import Destination
from condmsg.protocol import MessageKind

from .condmsg_helpers import publish_compensation, publish_copy, wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


def _original(channel: Any, queue: str, cm_id: str, sender: str = "s") -> None:
    publish_copy(
        channel,
        cm_id=cm_id,
        condition=Destination(queue, pickup_within=timedelta(seconds=30)),
        sender=sender,
        sent_at=datetime.now(UTC),
        body=b"original",
    )


def _compensation(channel: Any, queue: str, cm_id: str) -> None:
    publish_compensation(
        channel, queue=queue, cm_id=cm_id, destination=queue, sender="s", body=b"undo"
    )


def test_compensation_after_the_read_reaches_the_app_once(
    db_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    receiver = make_receiver(db_url)
    queue = f"{unique_name}.q"
    receiver._broker.ensure_queue(queue)
    cm_id = str(uuid.uuid4())
    _original(channel, queue, cm_id)
    first = wait_for(lambda: receiver.read(queue, timeout=0.5))
    assert first.kind is MessageKind.ORIGINAL
    _compensation(channel, queue, cm_id)
    _compensation(channel, queue, cm_id)  # a duplicate compensation is dropped
    second = wait_for(lambda: receiver.read(queue, timeout=0.5))
    assert (second.kind, second.cm_id, second.payload) == (
        MessageKind.COMPENSATION,
        cm_id,
        b"undo",
    )
    assert receiver.read(queue, timeout=0.5) is None
    assert receiver.stats.duplicates == 1


def test_compensation_before_the_read_cancels_both(
    db_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    receiver = make_receiver(db_url)
    queue = f"{unique_name}.q"
    receiver._broker.ensure_queue(queue)
    cm_id = str(uuid.uuid4())
    _original(channel, queue, cm_id)
    _compensation(channel, queue, cm_id)
    # The compensation's top priority makes it overtake the unread original.
    assert receiver.read(queue, timeout=1.0) is None
    assert receiver.stats.cancelled == 1
    assert receiver.stats.discards == 1
    assert receiver.stats.delivered == 0


def test_cancel_out_race_between_competing_consumers(
    pg_url: str, unique_name: str, make_receiver: Any, amqp_url: str
) -> None:
    """200 trials: originals and compensations published in random order and at random
    moments while two transactional consumers compete (some transactions roll back).
    Every trial must end with the app having seen the original and then the compensation,
    or neither."""
    import pika

    trials = 200
    queue = f"{unique_name}.q"
    consumers = [make_receiver(pg_url, f"controller-{i}", poll_interval_s=0.005) for i in (1, 2)]
    consumers[0]._broker.ensure_queue(queue)
    seen: dict[str, list[str]] = defaultdict(list)
    seen_lock = threading.Lock()
    done = threading.Event()
    errors: list[BaseException] = []
    # Set once a consumer has polled the queue: publishing waits for both, or a slow start
    # finds every pair queued already and the race is not run.
    polling = {id(r): threading.Event() for r in consumers}

    def consume(receiver: Any, seed: int) -> None:
        rnd = random.Random(seed)
        try:
            while not done.is_set():
                with receiver.transaction() as tx:
                    message = tx.read(queue, timeout=0.2)
                    polling[id(receiver)].set()
                    if message is None:
                        continue
                    time.sleep(rnd.uniform(0, 0.004))  # the app works inside the transaction
                    if rnd.random() < 0.1:
                        raise _Rollback
                    with seen_lock:
                        seen[message.cm_id].append(message.kind.value)
        except _Rollback:
            consume(receiver, seed + 1)
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=consume, args=(r, i), daemon=True) for i, r in enumerate(consumers)
    ]
    for thread in threads:
        thread.start()
    assert all(ready.wait(60) for ready in polling.values())
    params = pika.URLParameters(amqp_url)
    connection = pika.BlockingConnection(params)
    channel = connection.channel()
    rnd = random.Random(7)
    cm_ids = [str(uuid.uuid4()) for _ in range(trials)]
    for cm_id in cm_ids:
        if rnd.random() < 0.25:  # the compensation overtakes: it is published first
            _compensation(channel, queue, cm_id)
            time.sleep(rnd.uniform(0, 0.004))
            _original(channel, queue, cm_id)
            continue
        _original(channel, queue, cm_id)
        if rnd.random() < 0.5:
            time.sleep(rnd.uniform(0, 0.006))
        _compensation(channel, queue, cm_id)
        if rnd.random() < 0.3:
            time.sleep(rnd.uniform(0, 0.004))
    connection.close()

    def settled() -> bool:
        # Every trial finished in the RLOG: consumed and compensated, or cancelled and its
        # original discarded (the committed truth, whatever the consumers still hold).
        with consumers[0].engine.connect() as conn:
            finished = conn.execute(
                sa.select(sa.func.count()).where(
                    sa.or_(
                        sa.and_(rlog.c.state == "consumed", rlog.c.compensated_at.is_not(None)),
                        sa.and_(rlog.c.state == "cancelled", rlog.c.discarded_at.is_not(None)),
                    )
                )
            ).scalar_one()
        return bool(finished == trials)

    wait_for(settled, timeout=120, interval=0.2)
    done.set()
    for thread in threads:
        thread.join(10)
    assert not errors, errors
    outcomes = defaultdict(int)
    for cm_id in cm_ids:
        story = seen.get(cm_id, [])
        assert story in ([], ["original", "compensation"]), (cm_id, story)
        outcomes["both" if story else "neither"] += 1
    # Both endings occur, so the race was really run in both directions.
    assert outcomes["both"] > 0
    assert outcomes["neither"] > 0


class _Rollback(Exception):
    pass
