"""``Sender.outcomes()`` rides out a broker that goes away (DESIGN invariant 8): the stream
pauses, says so once each way, and resumes on a new connection; ``condmsg outcomes
--follow`` prints what comes after the outage too."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pika
import pytest

from condmsg.core import protocol
from condmsg.core.errors import BrokerError
from condmsg.core.evaluation import Verdict
from condmsg.core.outcome import OUTCOME_TYPE, Outcome
from condmsg.sending.sender import Sender
from tests.integration.tcp_proxy import TcpProxy
from tests.waiting import wait_for

pytestmark = [pytest.mark.rabbitmq]


@pytest.fixture
def broker_proxy() -> Iterator[TcpProxy]:
    proxy = TcpProxy()
    proxy.up()
    yield proxy
    proxy.close()


def _notify(channel: Any, sender: str, cm_id: str) -> None:
    now = datetime.now(UTC)
    outcome = Outcome(
        cm_id=cm_id,
        verdict=Verdict.SATISFIED,
        reasons=(),
        decided_at=now,
        effective_at=now,
        facts=(),
    )
    channel.basic_publish(
        "",
        protocol.outcome_queue(sender),
        outcome.to_json(),
        pika.BasicProperties(type=OUTCOME_TYPE, delivery_mode=2),
    )


def test_the_outcome_stream_resumes_after_the_broker_went_away(
    sqlite_url: str,
    amqp_url: str,
    unique_name: str,
    broker_proxy: TcpProxy,
    channel: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    name = unique_name.replace(".", "-")
    sender = Sender(
        name=name, amqp_url=broker_proxy.url(amqp_url), db_url=sqlite_url, create_schema=True
    )
    caplog.set_level(logging.INFO, logger="condmsg.sending.outcomes")
    got: list[str] = []
    failures: list[BaseException] = []

    def follow() -> None:
        try:
            for outcome in sender.outcomes(timeout=20):
                got.append(outcome.cm_id)
                if outcome.cm_id == "after":
                    return
        except BaseException as exc:  # reported by the test, not lost in a thread
            failures.append(exc)

    _notify(channel, name, "before")
    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        wait_for(lambda: got == ["before"] or None, timeout=15)
        broker_proxy.down()  # the node goes: the stream's connection breaks
        paused = f"reading the outcomes of {name!r} paused: RabbitMQ cannot be reached"
        wait_for(lambda: any(paused in r.getMessage() for r in caplog.records) or None, 15)
        _notify(channel, name, "after")
        broker_proxy.up()
        wait_for(lambda: got[-1:] == ["after"] or None, timeout=30)
    finally:
        thread.join(10)
    assert not failures, failures
    # "before" may come twice (handed over, not yet acked when the connection broke).
    assert got[0] == "before" and got[-1] == "after" and set(got) == {"before", "after"}
    lines = [r.getMessage() for r in caplog.records if r.name == "condmsg.sending.outcomes"]
    assert sum(" paused: " in line for line in lines) == 1, lines
    assert sum(" resumes: " in line for line in lines) == 1, lines
    sender.engine.dispose()


def test_an_outage_that_outlasts_the_timeout_ends_the_stream(
    sqlite_url: str, amqp_url: str, unique_name: str, broker_proxy: TcpProxy
) -> None:
    name = unique_name.replace(".", "-")
    sender = Sender(
        name=name, amqp_url=broker_proxy.url(amqp_url), db_url=sqlite_url, create_schema=True
    )
    broker_proxy.down()
    with pytest.raises(BrokerError, match="cannot reach RabbitMQ"):
        next(iter(sender.outcomes(timeout=1.0)))
    sender.engine.dispose()
