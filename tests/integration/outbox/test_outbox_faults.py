"""Faults: broker down, connection broken mid-batch, two relays, a relay killed by SIGKILL.

Each test shows that nothing is lost: every enqueued id reaches a real consumer at least once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import outbox
from outbox import OutboxMessage, Relay, RelayConfig
from tests.integration.outbox_helpers import Collector, declare_queues, delete_queues
from tests.integration.tcp_proxy import TcpProxy
from tests.waiting import wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


@pytest.fixture
def queue(amqp_url: str, unique_name: str) -> Iterator[str]:
    declare_queues(amqp_url, [unique_name])
    yield unique_name
    delete_queues(amqp_url, [unique_name])


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    p = TcpProxy()
    yield p
    p.close()


def fill(engine: sa.Engine, queue: str, n: int, chunk: int = 5000) -> list[int]:
    ids: list[int] = []
    for start in range(0, n, chunk):
        with Session(engine) as s, s.begin():
            ids += outbox.enqueue_many(
                s,
                [
                    OutboxMessage(exchange="", routing_key=queue, body=str(i).encode())
                    for i in range(start, min(n, start + chunk))
                ],
            )
    return ids


def test_broker_down_is_reported_and_retried(
    db_url: str, amqp_url: str, queue: str, proxy: TcpProxy
) -> None:
    engine = sa.create_engine(db_url)
    outbox.create_tables(engine)
    ids = fill(engine, queue, 300)
    collector = Collector(amqp_url, [queue])
    relay = Relay(engine, RelayConfig(amqp_url=proxy.url(amqp_url)))
    try:
        with relay:
            error = wait_for(lambda: relay.stats().last_error, 10, "an error reported")
            assert error == (
                f"cannot reach RabbitMQ at amqp://127.0.0.1:{proxy.port}: connection refused; "
                "is the broker running?"
            )
            assert "guest" not in error
            assert relay.status().pending == 300
            proxy.up()
            collector.wait_for(ids, timeout=30)
            relay.drain(15)
        assert sorted(collector.ids()) == ids
        assert relay.status().pending == 0
    finally:
        collector.close()
        engine.dispose()


def test_connection_broken_mid_batch_loses_nothing(
    db_url: str, amqp_url: str, queue: str, proxy: TcpProxy
) -> None:
    engine = sa.create_engine(db_url, pool_size=8)
    outbox.create_tables(engine)
    ids = fill(engine, queue, 8000)
    collector = Collector(amqp_url, [queue])
    proxy.up()
    relay = Relay(
        engine, RelayConfig(amqp_url=proxy.url(amqp_url), batch_size=200, max_batches_in_flight=4)
    )
    try:
        with relay:
            wait_for(lambda: len(collector.ids()) >= 1000, 30, "first deliveries")
            proxy.cut()  # both directions die mid-window
            wait_for(lambda: relay.stats().reconnects >= 1, 30, "a reconnect")
            collector.wait_for(ids, timeout=60)
            relay.drain(30)
        got = Counter(collector.ids())
        assert set(got) == set(ids)
        duplicates = sum(got.values()) - len(ids)
        assert duplicates <= 200 * 4  # at most one window in flight when the link broke
        assert "lost the connection to RabbitMQ" in str(relay.stats().last_error)
    finally:
        collector.close()
        engine.dispose()


def test_database_link_cut_mid_backlog_loses_nothing(
    pg_url: str, amqp_url: str, queue: str, store_proxy: TcpProxy
) -> None:
    """Claims (their lease and settings in the claim statement) and settles broken by cuts
    of the relay's database link: a claim that dies rolls its delete back, so its rows go
    out again; every row is published and none is left."""
    setup = sa.create_engine(pg_url)
    outbox.create_tables(setup)
    ids = fill(setup, queue, 6000)
    collector = Collector(amqp_url, [queue])
    engine = sa.create_engine(store_proxy.url(pg_url), pool_size=8)
    relay = Relay(engine, RelayConfig(amqp_url=amqp_url, batch_size=200, max_batches_in_flight=4))
    try:
        with relay:
            for seen in (1000, 2500, 4000):
                wait_for(lambda seen=seen: len(set(collector.ids())) >= seen, 60, "deliveries")
                store_proxy.cut()
            collector.wait_for(ids, timeout=90)
            relay.drain(60)
        assert set(collector.ids()) == set(ids)
        assert relay.metrics.store_errors._value.get() >= 1  # the cuts were met
        assert outbox.OutboxStore(setup).status().pending == 0
    finally:
        collector.close()
        engine.dispose()
        setup.dispose()


def test_two_relays_share_one_postgres_backlog(pg_url: str, amqp_url: str, queue: str) -> None:
    engine = sa.create_engine(pg_url, pool_size=12)
    outbox.create_tables(engine)
    ids = fill(engine, queue, 6000)
    collector = Collector(amqp_url, [queue])
    first = Relay(engine, RelayConfig(amqp_url=amqp_url, batch_size=100, connection_name="relay-1"))
    second = Relay(
        engine, RelayConfig(amqp_url=amqp_url, batch_size=100, connection_name="relay-2")
    )
    try:
        with first, second:
            collector.wait_for(ids, timeout=60)
            first.drain(15)
            second.drain(15)
        assert sorted(collector.ids()) == ids  # every id exactly once: no crash, no duplicate
        a, b = first.stats().published, second.stats().published
        assert a + b == len(ids)
        assert a > 0 and b > 0, (a, b)
    finally:
        collector.close()
        engine.dispose()


@pytest.mark.slow
def test_relay_process_killed_mid_backlog_loses_nothing(
    pg_url: str, amqp_url: str, queue: str
) -> None:
    engine = sa.create_engine(pg_url)
    outbox.create_tables(engine)
    ids = fill(engine, queue, 20_000)
    collector = Collector(amqp_url, [queue])
    env = {**os.environ, "CONDMSG_DB_URL": pg_url, "CONDMSG_AMQP_URL": amqp_url}
    cmd = [sys.executable, "-m", "condmsg.cli", "relay", "--log-level", "WARNING"]
    try:
        victim = subprocess.Popen(cmd, env=env)
        # Killed once it has settled some rows, judged by the outbox itself: the
        # collector's count lags the relay, which may have settled every row by then.
        store = outbox.OutboxStore(engine)
        wait_for(lambda: store.status().pending <= len(ids) - 3000, 60, "first settled rows")
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        assert outbox.OutboxStore(engine).status().pending > 0
        survivor = subprocess.Popen(cmd, env=env)
        try:
            collector.wait_for(ids, timeout=60)
            wait_for(lambda: outbox.OutboxStore(engine).status().pending == 0, 30, "empty")
        finally:
            survivor.send_signal(signal.SIGTERM)
            assert survivor.wait(30) == 0  # graceful exit on SIGTERM
        got = Counter(collector.ids())
        assert set(got) == set(ids)
        assert sum(got.values()) - len(ids) <= 500 * 4  # bounded by the confirm window
    finally:
        collector.close()
        engine.dispose()
