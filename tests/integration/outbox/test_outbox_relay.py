"""The relay against the real RabbitMQ and real databases, verified by a real consumer."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pika
import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from sqlalchemy.orm import Session

import outbox
from outbox import OutboxMessage, OutboxStore, Relay, RelayConfig
from outbox.enqueueing import enqueue_fanouts
from outbox.publish_confirms import COPY_HEADER, ROW_ID_HEADER
from tests.integration.outbox_helpers import (
    FANOUT_BODY,
    Collector,
    declare_queues,
    delete_queues,
    fanout,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    eng = sa.create_engine(db_url, pool_size=8)
    outbox.create_tables(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def queues(amqp_url: str, unique_name: str) -> Iterator[list[str]]:
    names = [f"{unique_name}.a", f"{unique_name}.b"]
    declare_queues(amqp_url, names)
    yield names
    delete_queues(amqp_url, names, exchanges=[f"{unique_name}.ex"])


def enqueue_range(engine: sa.Engine, queue: str, start: int, n: int) -> list[int]:
    with Session(engine) as s, s.begin():
        return outbox.enqueue_many(
            s,
            [
                OutboxMessage(exchange="", routing_key=queue, body=str(i).encode())
                for i in range(start, start + n)
            ],
        )


def test_every_row_is_published_once_with_its_properties_and_deleted(
    engine: sa.Engine, amqp_url: str, queues: list[str]
) -> None:
    q = queues[0]
    with Session(engine) as s, s.begin():
        special = outbox.enqueue(
            s,
            exchange="",
            routing_key=q,
            body=b"\x00\xffpayload",
            message_id="m-1",
            correlation_id="c-1",
            reply_to="replies",
            content_type="application/octet-stream",
            headers={"cm": "42", "n": [1, 2]},
            priority=5,
            expiration_ms=60000,
            persistent=True,
        )
    ids = [special, *enqueue_range(engine, q, 0, 1200)]
    collector = Collector(amqp_url, [q])
    registry = CollectorRegistry()
    try:
        relay = Relay(engine, RelayConfig(amqp_url=amqp_url, batch_size=100), registry=registry)
        stats = relay.run_until_idle(timeout_s=30)
        collector.wait_for(ids)
        assert sorted(collector.ids(q)) == ids  # each exactly once
        assert stats.published == len(ids)
        assert stats.failed == 0
        assert relay.status().pending == 0
        _, props, body = collector.deliveries[q][0]
        assert body == b"\x00\xffpayload"
        assert props.message_id == "m-1"
        assert props.correlation_id == "c-1"
        assert props.reply_to == "replies"
        assert props.content_type == "application/octet-stream"
        assert props.priority == 5
        assert props.expiration == "60000"
        assert props.delivery_mode == 2
        assert props.headers == {"cm": "42", "n": [1, 2], outbox.ROW_ID_HEADER: special}
        published = registry.get_sample_value(
            "condmsg_outbox_published_total", {"table": outbox.DEFAULT_TABLE_NAME}
        )
        assert published == len(ids)
    finally:
        collector.close()


def test_fifo_per_relay_and_queue(engine: sa.Engine, amqp_url: str, queues: list[str]) -> None:
    ids: list[int] = []
    for t in range(6):  # six committed transactions, alternating queues row by row
        with Session(engine) as s, s.begin():
            ids += outbox.enqueue_many(
                s,
                [
                    OutboxMessage(exchange="", routing_key=queues[i % 2], body=b"x")
                    for i in range(t * 300, t * 300 + 300)
                ],
            )
    collector = Collector(amqp_url, queues)
    try:
        Relay(
            engine, RelayConfig(amqp_url=amqp_url, batch_size=64, max_batches_in_flight=3)
        ).run_until_idle(30)
        collector.wait_for(ids)
        for q in queues:
            got = collector.ids(q)
            assert got == sorted(got), f"{q} out of id order"
        assert sorted(collector.ids()) == ids
    finally:
        collector.close()


def test_bad_rows_are_parked_with_a_reason_and_the_rest_goes_on(
    engine: sa.Engine, amqp_url: str, queues: list[str], unique_name: str
) -> None:
    q = queues[0]
    missing_exchange = f"{unique_name}.ex"
    good = enqueue_range(engine, q, 0, 50)
    with Session(engine) as s, s.begin():
        no_exchange = outbox.enqueue(s, exchange=missing_exchange, routing_key=q, body=b"404")
        unroutable = outbox.enqueue(s, exchange="", routing_key=f"{unique_name}.none", body=b"312")
    good += enqueue_range(engine, q, 50, 50)
    collector = Collector(amqp_url, [q])
    try:
        relay = Relay(engine, RelayConfig(amqp_url=amqp_url))
        stats = relay.run_until_idle(30)
        collector.wait_for(good)
        assert sorted(collector.ids(q)) == good
        assert stats.failed == 2
        reasons = {row.id: row.last_error for row in relay.store.failed_rows()}
        assert set(reasons) == {no_exchange, unroutable}
        assert f"exchange {missing_exchange!r} does not exist (404 NOT_FOUND)" in str(
            reasons[no_exchange]
        )
        assert "unroutable: 312 NO_ROUTE" in str(reasons[unroutable])
        assert relay.status().failed == 2
        # The operator fixes the topology and requeues: the parked row goes out.
        conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
        ch = conn.channel()
        ch.exchange_declare(missing_exchange, "direct")
        ch.queue_bind(q, missing_exchange, routing_key=q)
        conn.close()
        assert relay.store.requeue_failed([no_exchange]) == 1
        relay.run_until_idle(30)
        collector.wait_for([*good, no_exchange])
        assert relay.status().failed == 1
    finally:
        collector.close()


def test_background_relay_wakes_on_commit(
    engine: sa.Engine, amqp_url: str, queues: list[str]
) -> None:
    q = queues[0]
    collector = Collector(amqp_url, [q])
    # Polling is effectively off: only NOTIFY (PostgreSQL) or wake() (SQLite) can help.
    relay = Relay(
        engine, RelayConfig(amqp_url=amqp_url, poll_interval_s=60.0, rescan_interval_s=60.0)
    )
    try:
        with relay:
            relay.drain(15)
            for k in range(3):
                ids = enqueue_range(engine, q, k * 10, 10)
                if not relay.listen:
                    relay.wake()
                # Well inside the 60 s poll and rescan: only the wake can have sent them.
                collector.wait_for(ids, timeout=30)
            relay.drain(10)
            assert relay.stats().published == 30
        assert relay.stats().in_flight == 0
    finally:
        collector.close()


def test_status_cli_prints_backlog(db_url: str, engine: sa.Engine) -> None:
    enqueue_range(engine, "q", 0, 3)
    env = {**os.environ, "CONDMSG_DB_URL": db_url}
    out = subprocess.run(
        [sys.executable, "-m", "condmsg.cli", "relay", "--status"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert "pending:            3" in out.stdout
    assert "failed:             0" in out.stdout
    status = OutboxStore(engine).status()
    assert status.pending == 3


def test_the_relay_publishes_each_copy_and_parks_only_the_unroutable_one(
    engine: sa.Engine, amqp_url: str, unique_name: str
) -> None:
    queues = [f"{unique_name}.a", f"{unique_name}.b", f"{unique_name}.c"]
    declare_queues(amqp_url, queues[:2])  # the third does not exist yet: unroutable
    collector: Collector | None = None
    try:
        groups = [fanout(*queues) for _ in range(3)]
        with Session(engine) as s, s.begin():
            enqueue_fanouts(s, groups)
        collector = Collector(amqp_url, queues[:2])
        relay = Relay(engine, RelayConfig(amqp_url=amqp_url, batch_size=2))
        stats = relay.run_until_idle(timeout_s=30)
        assert (stats.published, stats.failed) == (6, 3)
        wait_for(lambda: len(collector.ids()) == 6 if collector else False, timeout=15)
        for queue, n in zip(queues[:2], (0, 1), strict=False):
            got = collector.deliveries[queue]
            assert len(got) == 3
            row_ids = [row_id for row_id, _, _ in got]
            assert len(set(row_ids)) == 3
            for _, props, body in got:
                assert body == FANOUT_BODY
                assert props.message_id == f"m-{n}"
                assert props.headers[COPY_HEADER] == n
                assert props.headers["dest"] == queue and props.headers["cm"] == "cm-1"
                assert props.headers["flag"] is (n == 1)
                assert (props.correlation_id, props.reply_to) == ("cm-1", "acks")
        store = OutboxStore(engine)
        failed = store.failed_rows()
        assert [f.attempts for f in failed] == [1, 1, 1]
        assert all("NO_ROUTE" in (f.last_error or "") for f in failed)
        # Declare the queue and requeue: only the third copy of each row goes out.
        declare_queues(amqp_url, queues[2:])
        collector.close()
        collector = Collector(amqp_url, queues)
        assert store.requeue_failed() == 3
        stats = relay.run_until_idle(timeout_s=30)
        assert stats.published == 9
        wait_for(lambda: len(collector.ids()) == 3 if collector else False, timeout=15)
        third = collector.deliveries[queues[2]]
        assert sorted(r for r, _, _ in third) == sorted(f.id for f in failed)
        assert {p.priority for _, p, _ in third} == {3}
        assert {p.headers[ROW_ID_HEADER] for _, p, _ in third} == {f.id for f in failed}
        assert collector.ids(queues[0]) == [] and collector.ids(queues[1]) == []
        assert store.status().pending == store.status().failed == 0
    finally:
        if collector is not None:
            collector.close()
        delete_queues(amqp_url, queues)


def test_a_row_that_cannot_be_encoded_is_parked_and_the_rest_goes_out(
    engine: sa.Engine, amqp_url: str, queues: list[str]
) -> None:
    q = queues[0]
    # Valid JSON, but no AMQP field type holds an int this large (nor a name this long).
    ok = OutboxMessage(exchange="", routing_key=q, body=b"ok")
    bad = [
        OutboxMessage(exchange="", routing_key=q, body=b"big", headers={"n": 2**64}),
        OutboxMessage(exchange="", routing_key=q, body=b"name", headers={"k" * 256: 1}),
    ]
    with Session(engine) as s, s.begin():
        ids = outbox.enqueue_many(s, [ok, bad[0], ok])
        ids += outbox.enqueue_many(s, [bad[1], ok])
    collector = Collector(amqp_url, [q])
    try:
        relay = Relay(engine, RelayConfig(amqp_url=amqp_url, batch_size=10))
        stats = relay.run_until_idle(timeout_s=20)
        collector.wait_for([ids[0], ids[2], ids[4]])
        assert sorted(collector.ids(q)) == [ids[0], ids[2], ids[4]]
        assert (stats.published, stats.failed) == (3, 2)
        failed = OutboxStore(engine).failed_rows()
        assert [f.id for f in failed] == [ids[1], ids[3]]
        assert "64 bits" in (failed[0].last_error or "")
        assert "255 bytes" in (failed[1].last_error or "")
    finally:
        collector.close()
