"""Fixtures for integration tests: one broker connection per worker, factories for
senders and receivers that are closed after the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
import sqlalchemy as sa

from ackd.receiver import Receiver

from .condmsg_helpers import SECRET
from .tcp_proxy import TcpProxy


@pytest.fixture(scope="session")
def amqp_connection(amqp_url: str) -> Iterator[pika.BlockingConnection]:
    params = pika.URLParameters(amqp_url)
    params.heartbeat = 0  # idle between tests; no I/O loop runs to answer heartbeats
    connection = pika.BlockingConnection(params)
    yield connection
    if connection.is_open:
        connection.close()


@pytest.fixture
def channel(amqp_connection: pika.BlockingConnection) -> Iterator[Any]:
    """A fresh channel of the worker's connection (a 404 closes only this one)."""
    ch = amqp_connection.channel()
    yield ch
    if ch.is_open:
        ch.close()


@pytest.fixture
def make_receiver(amqp_url: str, unique_name: str) -> Iterator[Callable[..., Receiver]]:
    """Receivers of this test; their invalid-message queue is the test's own. The tables of
    ``app_tables`` are created in the receiver's store, where an app keeps its own rows
    (written in the receiver's transactions)."""
    made: list[Receiver] = []

    def factory(
        db_url: str,
        recipient: str = "alice",
        *,
        app_tables: sa.MetaData | None = None,
        **options: Any,
    ) -> Receiver:
        options.setdefault("invalid_queue", f"{unique_name}.invalid")
        options.setdefault("create_schema", True)
        receiver = Receiver(amqp_url=amqp_url, db_url=db_url, recipient=recipient, **options)
        made.append(receiver)
        if app_tables is not None:
            app_tables.create_all(receiver.engine)
        return receiver

    yield factory
    for receiver in made:
        receiver.close()
        receiver.engine.dispose()


@pytest.fixture
def test_secret() -> bytes:
    return SECRET


@pytest.fixture
def store_proxy(pg_engine_url: str) -> Iterator[TcpProxy]:
    """A proxy to PostgreSQL, listening: connect through ``store_proxy.url(pg_url)`` and
    ``cut()`` it to break the database link."""
    proxy = TcpProxy.to(pg_engine_url)
    proxy.up()
    yield proxy
    proxy.close()


@pytest.fixture(params=["sync", "async"])
def make_either_receiver(
    request: pytest.FixtureRequest, make_receiver: Callable[..., Receiver]
) -> Iterator[Callable[..., Any]]:
    """``make_receiver``, run once with the sync ``Receiver`` and once with the
    ``AsyncReceiver`` behind the same calls (:mod:`.receiver_kinds`), for fault tests
    whose body holds for both."""
    drivers: list[Any] = []

    def factory(db_url: str, recipient: str = "alice", **options: Any) -> Any:
        receiver = make_receiver(db_url, recipient, **options)
        if request.param == "sync":
            return receiver
        from ackd import AsyncReceiver

        from .receiver_kinds import AsyncReceiverDriver

        clock = {"clock": options["clock"]} if "clock" in options else {}
        driver = AsyncReceiverDriver(
            receiver, AsyncReceiver(receiver.config, recipient=receiver.recipient, **clock)
        )
        drivers.append(driver)
        return driver

    yield factory
    for driver in drivers:
        driver.close()
