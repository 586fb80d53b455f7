"""A connection attempt that fails with whatever the client library raises is one failed
attempt: the evaluator and the relay retry it with their backoff (DESIGN invariant 8).

While the network fails, pika lets errors other than its own through from a socket that
broke mid-handshake (a ``ValueError`` from ``getpeername()``, seen in a fault run); these
tests make the first attempts raise such errors and check that the services carry on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import outbox
import outbox.publish_confirms
from condmsg import Destination, tables
from condmsg.core import protocol
from condmsg.core.timeutil import utcnow
from condmsg.runtime import amqp
from condmsg.runtime.topology import declare_service_queue
from evaluator.config import EvaluatorConfig
from evaluator.service import Evaluator
from outbox import OutboxMessage, Relay, RelayConfig
from tests.integration.condmsg_helpers import SECRET, ack_body
from tests.integration.outbox_helpers import Collector, declare_queues, delete_queues
from tests.waiting import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

#: What a broken network has made pika raise, and errors nobody expects.
UNEXPECTED = [
    ValueError("Expected connected socket, but getpeername() failed"),
    RuntimeError("the I/O loop was in an unexpected state"),
    IndexError("pop from an empty deque"),
]
FAILED_ATTEMPTS = 3


class Flaky:
    """Stands in for a pika connection class: its first ``FAILED_ATTEMPTS`` attempts
    whose connection name starts with ``prefix`` raise ``error``; the rest connect."""

    def __init__(self, real: Callable[..., Any], prefix: str, error: Exception) -> None:
        self._real = real
        self._prefix = prefix
        self._error = error
        self._lock = threading.Lock()
        self.raised = 0

    def __call__(self, params: Any, *args: Any, **kwargs: Any) -> Any:
        name = str((params.client_properties or {}).get("connection_name", ""))
        with self._lock:
            fail = name.startswith(self._prefix) and self.raised < FAILED_ATTEMPTS
            if fail:
                self.raised += 1
        if fail:
            raise self._error
        return self._real(params, *args, **kwargs)


@pytest.fixture(params=UNEXPECTED, ids=lambda e: type(e).__name__)
def error(request: pytest.FixtureRequest) -> Exception:
    return request.param  # type: ignore[no-any-return]


def test_the_evaluator_retries_a_connection_attempt_that_raised(
    error: Exception,
    pg_url: str,
    unique_name: str,
    make_sender: Any,
    amqp_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = unique_name.replace(".", "-")
    sender = make_sender(pg_url, name, declare_queues=False)
    queue = f"{unique_name}.q"
    cm = sender.send(b"x", Destination(queue, pickup_within=timedelta(minutes=1)))
    with amqp.connect(amqp_url) as connection:
        channel = connection.channel()
        declare_service_queue(channel, protocol.ack_queue(name))
        channel.basic_publish(
            "", protocol.ack_queue(name), ack_body(cm, queue, utcnow(), receiver="rx")
        )
    flaky = Flaky(amqp.pika.BlockingConnection, f"condmsg-evaluator-{name}", error)
    monkeypatch.setattr(amqp.pika, "BlockingConnection", flaky)
    service = Evaluator(
        EvaluatorConfig(
            amqp_url=amqp_url,
            sender=name,
            db_url=pg_url,
            secret=SECRET,
            relay=False,
            sweep_interval_s=3600,
        )
    )

    def decided() -> bool:
        with sender.engine.connect() as conn:
            state = conn.execute(sa.select(tables.cms.c.state)).scalar_one()
        return state == "satisfied"

    with service:
        wait_for(decided, timeout=30)
        assert service.running
    assert flaky.raised == FAILED_ATTEMPTS


@pytest.fixture
def queue(amqp_url: str, unique_name: str) -> Iterator[str]:
    declare_queues(amqp_url, [unique_name])
    yield unique_name
    delete_queues(amqp_url, [unique_name])


def test_the_relay_retries_a_connection_attempt_that_raised(
    error: Exception, db_url: str, amqp_url: str, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = sa.create_engine(db_url)
    outbox.create_tables(engine)
    with Session(engine) as session, session.begin():
        ids = outbox.enqueue_many(
            session,
            [OutboxMessage(exchange="", routing_key=queue, body=b"%d" % i) for i in range(5)],
        )
    flaky = Flaky(outbox.publish_confirms.SelectConnection, "flaky-relay", error)
    monkeypatch.setattr(outbox.publish_confirms, "SelectConnection", flaky)
    collector = Collector(amqp_url, [queue])
    relay = Relay(engine, RelayConfig(amqp_url=amqp_url, connection_name="flaky-relay"))
    try:
        with relay:
            collector.wait_for(ids, timeout=30)
            assert relay.liveness() is None
        assert flaky.raised == FAILED_ATTEMPTS
        assert sorted(collector.ids()) == ids
    finally:
        collector.close()
        engine.dispose()
