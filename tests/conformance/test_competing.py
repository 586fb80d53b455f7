"""A Node consumer and a Python consumer compete for one queue with one shared receiver
store: every original reaches one application exactly once, and every compensation
cancels out or follows its original, whoever took which message (or which part of a
Message Sequence)."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pika
import pytest
import sqlalchemy as sa
from pika.adapters.blocking_connection import BlockingChannel

from ackd.tables import metadata as receiver_metadata
from ackd.tables import rlog, sequence_parts
from condmsg import Destination
from condmsg.conformance import ConformanceConfig, app_table
from condmsg.core import protocol
from condmsg.runtime import migrate
from condmsg.runtime.db import make_engine
from condmsg.runtime.topology import declare_destination, declare_service_queue
from condmsg.sending.copies import notice_message, plan_copies
from outbox.config import RelayConfig
from outbox.message import OutboxMessage
from outbox.relay import Relay
from tests.integration.condmsg_helpers import publish
from tests.waiting import wait_for

from .conftest import PYTHON_RECEIVER, node_receiver

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

CMS = 500
#: Sequences of a few parts each, small enough to keep the run short.
PART_BYTES = 1024
SECRET = "competing-consumers-secret-5c9a1e7f"


def test_node_and_python_consumers_share_one_queue_exactly_once(
    amqp_url: str, pg_url: str, unique_name: str, tmp_path: Path
) -> None:
    queue, sender = f"{unique_name}.q", unique_name.replace(".", "-")
    config = ConformanceConfig(
        amqp_url=amqp_url,
        store_url=pg_url,
        receiver_cmd="",
        queue=queue,
        recipient="competing",
        secret=SECRET,
        invalid_queue=f"{unique_name}.invalid",
    )
    store = make_engine(pg_url)
    migrate.ensure(store, "receiver", models=[receiver_metadata], create=True)
    app_table.create(store)
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = connection.channel()
    declare_destination(connection, queue)
    declare_service_queue(channel, config.invalid)
    declare_service_queue(channel, protocol.ack_queue(sender))
    relay = Relay(store, RelayConfig(amqp_url=amqp_url)).start()
    procs = [
        subprocess.Popen(
            cmd,
            shell=True,
            env=config.receiver_env(),
            stdout=(tmp_path / f"{name}.log").open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for name, cmd in (("python", PYTHON_RECEIVER), ("node", node_receiver()))
    ]
    try:
        wait_for(
            lambda: channel.queue_declare(queue, passive=True).method.consumer_count == 2,
            timeout=60,
            what="the Python and the Node consumer",
        )
        compensated: set[str] = set()
        bodies: dict[str, bytes] = {}
        condition = Destination(queue, pickup_within=timedelta(minutes=5))
        for i in range(CMS):
            cm_id = str(uuid.uuid4())
            # Every 10th a Message Sequence, whose parts either consumer may store.
            body = bodies[cm_id] = f"cm {i} ".encode() * (300 if i % 10 == 0 else 1)
            (plan,) = plan_copies(
                cm_id=cm_id,
                condition=condition,
                sender=sender,
                sent_at=datetime.now(UTC),
                secret=SECRET.encode(),
                body=body,
                content_type="text/plain; charset=utf-8",
                app_headers={},
                part_bytes=PART_BYTES,
            )
            for message in plan.messages * (2 if i % 5 == 0 else 1):  # some duplicates
                publish(channel, message)
            if i % 3 == 0:  # a compensation racing its original
                compensated.add(cm_id)
                publish(channel, _compensation(queue, sender, cm_id))

        wait_for(lambda: _all_judged(store, compensated), timeout=180, interval=0.5)
        wait_for(
            lambda: channel.queue_declare(queue, passive=True).method.message_count == 0,
            timeout=60,
            what="the duplicates to be read too",
        )
        got: dict[str, list[str]] = defaultdict(list)
        for row in app_table.rows(store):
            got[str(row.cm_id)].append(row.kind)
            if row.kind == "original":
                assert bytes(row.body) == bodies[str(row.cm_id)], row.cm_id
        delivered = {cm for cm, kinds in got.items() if "original" in kinds}
        for cm_id, kinds in got.items():
            expected = [["compensation", "original"]] if cm_id in compensated else [["original"]]
            assert sorted(kinds) in expected, (cm_id, kinds)
        assert len(delivered - compensated) == CMS - len(compensated)
        with store.connect() as conn:
            count = sa.func.count(sa.distinct(rlog.c.receiver))
            receivers = conn.execute(sa.select(count)).scalar_one()
        assert receivers == 2, "both consumers should have taken messages"
        acks: list[str] = []
        wait_for(
            lambda: len(_drain_commit_acks(channel, sender, acks)) >= len(delivered),
            timeout=60,
            what="a COMMIT ack for every delivered original",
        )
        assert sorted(acks) == sorted(delivered)
        print(
            f"{len(delivered)} originals delivered once ({len(compensated)} compensated, "
            f"{len(compensated) - len(delivered & compensated)} cancelled out)"
        )
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.wait(30)
        relay.stop()
        connection.close()
        store.dispose()


def _drain_commit_acks(channel: BlockingChannel, sender: str, into: list[str]) -> list[str]:
    """Add the CM ids of the COMMIT acks waiting in the sender's ack queue to ``into``."""
    while True:
        method, _, body = channel.basic_get(protocol.ack_queue(sender), auto_ack=True)
        if method is None or body is None:
            return into
        ack = protocol.AckMessage.from_json(body)
        assert ack.kind.value == "commit"
        into.append(ack.cm_id)


def _all_judged(store: sa.engine.Engine, compensated: set[str]) -> bool:
    """Every compensated CM's pair is judged: compensated after consuming, or discarded
    after cancelling; every other CM consumed; no part waits in the store."""
    with store.connect() as conn:
        rows = {
            r.cm_id: r
            for r in conn.execute(
                sa.select(rlog.c.cm_id, rlog.c.state, rlog.c.compensated_at, rlog.c.discarded_at)
            )
        }
    if len(rows) < CMS:
        return False
    with store.connect() as conn:
        if conn.execute(sa.select(sa.func.count()).select_from(sequence_parts)).scalar_one():
            return False
    for cm_id, row in rows.items():
        if cm_id in compensated:
            if row.state == "consumed" and row.compensated_at is None:
                return False
            if row.state == "cancelled" and row.discarded_at is None:
                return False
    return True


def _compensation(queue: str, sender: str, cm_id: str) -> OutboxMessage:
    return notice_message(
        kind=protocol.MessageKind.COMPENSATION,
        cm_id=cm_id,
        destination=queue,
        recipient=None,
        sender=sender,
        sent_at=datetime.now(UTC),
        exchange="",
        routing_key=queue,
        body=b"undo",
        content_type="application/octet-stream",
        secret=SECRET.encode(),
    )
