"""Failover of each component over the three-node cluster: given every node's address, it
connects to the first that answers and, when that node goes, carries on on another one.

Every component starts while all nodes run, so each is on node 1 (the first address) and
leads the queues it declared there; the test then stops node 1 mid-traffic.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from ackd.receiver import Receiver
from condmsg import Destination, Verdict
from condmsg.runtime.amqp import connect, connected_address, describe_url
from condmsg.sending.sender import Sender
from tests.running_world import RunningWorld
from tests.waiting import wait_for

from .conftest import Cluster

pytestmark = [
    pytest.mark.rabbitmq,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.xdist_group("rabbitmq-cluster"),
]


def _receiver(nodes: Cluster, pg_url: str, unique_name: str) -> Receiver:
    return Receiver(
        amqp_url=nodes.url,
        db_url=pg_url,
        recipient="alice",
        invalid_queue=f"{unique_name}.invalid",
        create_schema=True,
        poll_interval_s=0.01,
    )


def _condition(queue: str) -> Destination:
    return Destination(queue, pickup_within=timedelta(seconds=60))


def _consume_in_background(
    receiver: Receiver, queue: str, seen: Counter[str], stop: threading.Event
) -> threading.Thread:
    def handle(message: Any, _session: Any) -> None:
        seen[message.cm_id] += 1

    thread = threading.Thread(
        target=receiver.consume,
        args=(queue, handle),
        kwargs={"stop": stop, "prefetch": 50},
        daemon=True,
    )
    thread.start()
    return thread


def test_connect_opens_the_first_node_that_answers(nodes: Cluster) -> None:
    connection = connect(nodes.url)
    assert connected_address(connection) == f"127.0.0.1:{nodes.port(1)}"
    connection.close()
    nodes.stop_node(1)
    connection = connect(nodes.urls)  # a list is taken as well as the comma-separated form
    assert connected_address(connection) == f"127.0.0.1:{nodes.port(2)}"
    connection.close()
    shown = describe_url(nodes.url)
    assert "guest" not in shown
    assert all(f":{nodes.port(n)}/" in shown for n in (1, 2, 3))


def test_cli_answers_with_its_first_node_down(nodes: Cluster, pg_url: str) -> None:
    nodes.stop_node(1)
    env = dict(os.environ, CONDMSG_AMQP_URL=nodes.url, CONDMSG_DB_URL=pg_url)
    done = subprocess.run(
        [sys.executable, "-m", "condmsg.cli", "check-services"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "guest" not in done.stdout + done.stderr


def test_sender_relay_and_receiver_carry_on_after_their_node_goes(
    nodes: Cluster, quorum_sender: Sender, pg_url: str, unique_name: str
) -> None:
    """The sender's relay republishes what was unconfirmed at the loss; the consuming
    receiver resumes on another node; its log keeps every CM to one delivery."""
    sender = quorum_sender
    queue = f"{unique_name}.q"
    receiver = _receiver(nodes, pg_url, unique_name)
    seen: Counter[str] = Counter()
    stop = threading.Event()
    relay = sender.start_relay(batch_size=20)
    try:
        sent = [sender.send(f"m{i}".encode(), _condition(queue)) for i in range(150)]
        consumer = _consume_in_background(receiver, queue, seen, stop)
        wait_for(lambda: len(seen) >= 30, 30, "the first deliveries")
        assert receiver._broker._connection is not None
        assert connected_address(receiver._broker._connection).endswith(f":{nodes.port(1)}")
        lost_at = time.monotonic()
        nodes.stop_node(1)
        sent += [sender.send(f"n{i}".encode(), _condition(queue)) for i in range(150)]
        wait_for(lambda: len(seen) == len(sent), 90, "every CM delivered after the loss")
        recovered_s = time.monotonic() - lost_at
        assert relay.stats().connected and relay.stats().reconnects >= 1
        stop.set()
        consumer.join(30)
    finally:
        stop.set()
        relay.stop()
        receiver.close()
        receiver.engine.dispose()
    assert set(seen) == set(sent)
    assert max(seen.values()) == 1, "an original reached the app twice"
    print(f"every CM delivered {recovered_s:.1f} s after node 1 went")


def test_evaluator_decides_on_another_node(
    nodes: Cluster, node_loss_world: RunningWorld, pg_url: str, unique_name: str
) -> None:
    sender = node_loss_world.sender
    queue = f"{unique_name}.q"
    receiver = _receiver(nodes, pg_url, unique_name)
    seen: Counter[str] = Counter()
    stop = threading.Event()
    relay = sender.start_relay()
    receiver_relay = receiver.start_relay()
    try:
        first = [sender.send(b"x", _condition(queue)) for _ in range(40)]
        consumer = _consume_in_background(receiver, queue, seen, stop)
        wait_for(lambda: all(sender.outcome(cm) is not None for cm in first), 60, "first outcomes")
        nodes.stop_node(1)
        later = [sender.send(b"y", _condition(queue)) for _ in range(40)]
        wait_for(
            lambda: all(sender.outcome(cm) is not None for cm in later),
            90,
            "outcomes of the CMs sent after the loss",
        )
        stop.set()
        consumer.join(30)
    finally:
        stop.set()
        relay.stop()
        receiver_relay.stop()
        receiver.close()
        receiver.engine.dispose()
    outcomes = [sender.outcome(cm) for cm in first + later]
    assert all(o is not None and o.verdict is Verdict.SATISFIED for o in outcomes)
