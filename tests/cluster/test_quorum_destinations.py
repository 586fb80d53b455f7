"""Quorum destination queues (CONDMSG_DESTINATION_QUEUE_TYPE=quorum) on the cluster.

RabbitMQ 3.x quorum queues have no message priorities, so a compensation no longer
overtakes an unread original; the receiver's log must still end every CM in one of the
paper's two outcomes: the app got the original and then its compensation, or neither. A
queue of the other type is refused at start with one clear error.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pika
import pytest

from ackd.receiver import Receiver
from condmsg import Destination
from condmsg.core.errors import ConfigError
from condmsg.core.protocol import MessageKind
from condmsg.runtime.amqp import connect
from condmsg.runtime.topology import declare_destination
from condmsg.sending.sender import Sender
from tests.integration.cancel_out_race import run_cancel_out_race, send_compensation
from tests.integration.condmsg_helpers import SECRET, publish_original
from tests.waiting import wait_for

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
        publish_original(channel, queue, cm_id)
        send_compensation(channel, queue, cm_id)
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
        send_compensation(channel, queue, cm_id)
        publish_original(channel, queue, cm_id)
        assert receiver.read(queue, timeout=1.0) is None
        assert receiver.read(queue, timeout=1.0) is None
        assert (receiver.stats.cancelled, receiver.stats.discards) == (1, 1)
        assert receiver.stats.delivered == 0
    finally:
        receiver.close()
        receiver.engine.dispose()


def test_cancel_out_race_on_quorum_queues(quorum: Cluster, pg_url: str, unique_name: str) -> None:
    """The classic-queue race of ``test_cancel_out``, every trial steered to one of its
    endings, with two transactional consumers competing for a quorum queue."""
    queue = f"{unique_name}.q"
    consumers = [_receiver(quorum, pg_url, unique_name, f"c{i}") for i in (1, 2)]
    connection = pika.BlockingConnection(pika.URLParameters(quorum.node_url(2)))
    try:
        consumers[0]._broker.ensure_queue(queue)
        channel = connection.channel()
        # With confirms, as the relay publishes: publishes without them, made after
        # another test had restarted a node, were seen to vanish on their way to the
        # quorum queue's leader, which a confirm would have reported.
        channel.confirm_delivery()
        endings = run_cancel_out_race(consumers, queue, channel)
    finally:
        connection.close()
        for receiver in consumers:
            receiver.close()
            receiver.engine.dispose()
    assert endings == {"both": 10, "neither": 20}


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
    caplog.set_level(logging.INFO, logger="condmsg.sending.sender")
    sender = _sender(quorum, pg_url, unique_name)
    sender.engine.dispose()
    lines = [r.getMessage() for r in caplog.records if r.name == "condmsg.sending.sender"]
    assert any(
        "RabbitMQ 3.10" in line and "quorum destination queues without priorities" in line
        for line in lines
    ), lines
