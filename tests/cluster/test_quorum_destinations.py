"""Quorum destination queues (CONDMSG_DESTINATION_QUEUE_TYPE=quorum) on the cluster.

RabbitMQ 3.x quorum queues have no message priorities, so a compensation no longer
overtakes an unread original; the receiver's log must still end every CM in one of the
paper's two outcomes: the app got the original and then its compensation, or neither. A
queue of the other type is refused at start with one clear error.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pika
import pytest
import sqlalchemy as sa

from ackd.receiver import Receiver
from ackd.tables import rlog
from condmsg import Destination
from condmsg.amqp import connect
from condmsg.errors import ConfigError
from condmsg.protocol import MessageKind
from condmsg.sender import Sender
from condmsg.topology import declare_destination
from tests.integration.condmsg_helpers import SECRET, wait_for
from tests.integration.test_cancel_out import _compensation, _original

from .conftest import Cluster

pytestmark = [
    pytest.mark.rabbitmq,
    pytest.mark.postgres,
    pytest.mark.xdist_group("rabbitmq-cluster"),
]


@pytest.fixture
def quorum(monkeypatch: pytest.MonkeyPatch, nodes: Cluster) -> Cluster:
    monkeypatch.setenv("CONDMSG_DESTINATION_QUEUE_TYPE", "quorum")
    return nodes


@pytest.fixture
def channel(quorum: Cluster) -> Iterator[Any]:
    connection = connect(quorum.url)
    channel = connection.channel()
    channel.confirm_delivery()  # as the relay publishes (see the race test)
    yield channel
    connection.close()


def _sender(nodes: Cluster, db_url: str, name: str) -> Sender:
    return Sender(
        amqp_url=nodes.url,
        db_url=db_url,
        name=name.replace(".", "-"),
        secret=SECRET,
        create_schema=True,
        destination_queue_type="quorum",
    )


def _receiver(nodes: Cluster, db_url: str, name: str, recipient: str = "alice") -> Receiver:
    return Receiver(
        amqp_url=nodes.url,
        db_url=db_url,
        recipient=recipient,
        invalid_queue=f"{name}.invalid",
        create_schema=True,
        poll_interval_s=0.005,
    )


def _queue_type(nodes: Cluster, queue: str) -> str:
    listed = json.loads(nodes.run("ctl", "1", "list_queues", "name", "type", "--formatter", "json"))
    return next(str(q["type"]) for q in listed if q["name"] == queue)


def test_an_unread_original_and_its_compensation_reach_the_app_in_order(
    quorum: Cluster, pg_url: str, unique_name: str, channel: Any
) -> None:
    """Without priorities the compensation waits behind its original: the app gets both."""
    receiver = _receiver(quorum, pg_url, unique_name)
    queue = f"{unique_name}.q"
    try:
        receiver._broker.ensure_queue(queue)
        assert _queue_type(quorum, queue) == "quorum"
        cm_id = str(uuid.uuid4())
        _original(channel, queue, cm_id)
        _compensation(channel, queue, cm_id)
        first = wait_for(lambda: receiver.read(queue, timeout=0.5))
        second = wait_for(lambda: receiver.read(queue, timeout=0.5))
        assert first is not None and second is not None
        assert (first.kind, second.kind) == (MessageKind.ORIGINAL, MessageKind.COMPENSATION)
        assert receiver.read(queue, timeout=0.5) is None
        assert receiver.stats.cancelled == 0
    finally:
        receiver.close()
        receiver.engine.dispose()


def test_a_compensation_published_first_cancels_both(
    quorum: Cluster, pg_url: str, unique_name: str, channel: Any
) -> None:
    receiver = _receiver(quorum, pg_url, unique_name)
    queue = f"{unique_name}.q"
    try:
        receiver._broker.ensure_queue(queue)
        cm_id = str(uuid.uuid4())
        _compensation(channel, queue, cm_id)
        _original(channel, queue, cm_id)
        assert receiver.read(queue, timeout=1.0) is None
        assert receiver.read(queue, timeout=1.0) is None
        assert (receiver.stats.cancelled, receiver.stats.discards) == (1, 1)
        assert receiver.stats.delivered == 0
    finally:
        receiver.close()
        receiver.engine.dispose()


def test_cancel_out_race_on_quorum_queues(quorum: Cluster, pg_url: str, unique_name: str) -> None:
    """120 trials, originals and compensations in random order and at random moments,
    two transactional consumers competing (some roll back): each CM ends with the app
    having seen the original then the compensation, or neither."""
    trials = 120
    queue = f"{unique_name}.q"
    consumers = [_receiver(quorum, pg_url, unique_name, f"c{i}") for i in (1, 2)]
    consumers[0]._broker.ensure_queue(queue)
    seen: dict[str, list[str]] = defaultdict(list)
    lock = threading.Lock()
    done = threading.Event()
    errors: list[BaseException] = []
    polling = {id(r): threading.Event() for r in consumers}

    def consume(receiver: Receiver, seed: int) -> None:
        rnd = random.Random(seed)
        while not done.is_set():
            try:
                with receiver.transaction() as tx:
                    message = tx.read(queue, timeout=0.2)
                    polling[id(receiver)].set()
                    if message is None:
                        continue
                    time.sleep(rnd.uniform(0, 0.004))  # the app works inside the transaction
                    if rnd.random() < 0.1:
                        raise _Rollback
                    with lock:
                        seen[str(message.cm_id)].append(str(getattr(message.kind, "value", "")))
            except _Rollback:
                continue
            except BaseException as exc:
                errors.append(exc)
                return

    threads = [
        threading.Thread(target=consume, args=(r, i), daemon=True) for i, r in enumerate(consumers)
    ]
    for thread in threads:
        thread.start()
    try:
        assert all(ready.wait(60) for ready in polling.values())
        connection = pika.BlockingConnection(pika.URLParameters(quorum.node_url(2)))
        channel = connection.channel()
        # With confirms, as the relay publishes: publishes without them, made after
        # another test had restarted a node, were seen to vanish on their way to the
        # quorum queue's leader, which a confirm would have reported.
        channel.confirm_delivery()
        rnd = random.Random(11)
        cm_ids = [str(uuid.uuid4()) for _ in range(trials)]
        for cm_id in cm_ids:
            if rnd.random() < 0.25:
                _compensation(channel, queue, cm_id)
                time.sleep(rnd.uniform(0, 0.004))
                _original(channel, queue, cm_id)
                continue
            _original(channel, queue, cm_id)
            if rnd.random() < 0.5:
                time.sleep(rnd.uniform(0, 0.006))
            _compensation(channel, queue, cm_id)
        connection.close()

        def settled() -> bool:
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
    finally:
        done.set()
        for thread in threads:
            thread.join(10)
        for receiver in consumers:
            receiver.close()
            receiver.engine.dispose()
    assert not errors, errors
    endings: dict[str, int] = defaultdict(int)
    for cm_id in cm_ids:
        story = seen.get(cm_id, [])
        assert story in ([], ["original", "compensation"]), (cm_id, story)
        endings["both" if story else "neither"] += 1
    assert endings["both"] > 0 and endings["neither"] > 0


class _Rollback(Exception):
    pass


def test_a_queue_of_the_other_type_is_one_clear_error(
    quorum: Cluster, pg_url: str, unique_name: str
) -> None:
    classic_queue, quorum_queue = f"{unique_name}.a", f"{unique_name}.b"
    connection = connect(quorum.url)
    try:
        declare_destination(connection, classic_queue, "classic")
        declare_destination(connection, quorum_queue, "quorum")
    finally:
        connection.close()
    sender = _sender(quorum, pg_url, unique_name)
    try:
        with pytest.raises(ConfigError) as raised:
            sender.send(b"x", Destination(classic_queue, pickup_within=timedelta(seconds=5)))
        text = str(raised.value)
        assert classic_queue in text and "CONDMSG_DESTINATION_QUEUE_TYPE" in text
        assert "exists as a classic queue" in text and "docs/operations.md" in text
    finally:
        sender.engine.dispose()
    receiver = _receiver(quorum, pg_url, unique_name)
    receiver._broker.queue_type = "classic"
    try:
        with pytest.raises(ConfigError, match="exists as a quorum queue"):
            receiver._broker.ensure_queue(quorum_queue)
    finally:
        receiver.close()
        receiver.engine.dispose()


def test_the_broker_version_and_the_mode_are_logged(
    quorum: Cluster, pg_url: str, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="condmsg.sender")
    sender = _sender(quorum, pg_url, unique_name)
    sender.engine.dispose()
    lines = [r.getMessage() for r in caplog.records if r.name == "condmsg.sender"]
    assert any(
        "RabbitMQ 3.10" in line and "quorum destination queues without priorities" in line
        for line in lines
    ), lines
