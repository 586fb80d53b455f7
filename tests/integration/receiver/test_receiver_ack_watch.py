"""A receiver whose acks cannot leave its store (no relay publishes its outbox) says so: a
warning at start and while reading, and gauges in the registry it is given."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry

from condmsg import Destination
from tests.integration.condmsg_helpers import sender_name
from tests.waiting import wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


def _age_acks(engine: sa.Engine, seconds: float) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE condmsg_outbox SET created_at = :at"),
            {"at": datetime.now(UTC) - timedelta(seconds=seconds)},
        )


def test_stuck_acks_are_reported_at_start_and_while_reading(
    pg_url: str,
    sqlite_url: str,
    unique_name: str,
    make_sender: Any,
    make_receiver: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = f"{unique_name}.q"
    sender = make_sender(pg_url, sender_name(unique_name))
    sender.send(b"x", Destination(queue, pickup_within=timedelta(minutes=5)))
    with sender.relay():
        rx = make_receiver(sqlite_url, "alice")  # a store of its own, and no relay for it
        assert rx.read(queue, timeout=5) is not None
    assert not rx.ack_watch.stuck
    _age_acks(rx.engine, 120)  # as if nobody had published them for two minutes
    caplog.set_level(logging.WARNING, logger="ackd.ack_watch")
    registry = CollectorRegistry()
    again = make_receiver(sqlite_url, "alice", registry=registry)
    assert again.ack_watch.stuck
    warnings = [r.getMessage() for r in caplog.records if r.name == "ackd.ack_watch"]
    assert len(warnings) == 1 and "no relay publishes this receiver's store" in warnings[0]
    assert registry.get_sample_value("condmsg_receiver_outbox_pending_acks") == 1
    assert registry.get_sample_value("condmsg_receiver_outbox_oldest_ack_age_seconds") >= 119
    # Reading looks again (here: at once) and does not repeat the warning.
    assert again.ack_watch.check(now=True) is not None
    assert len([r for r in caplog.records if r.name == "ackd.ack_watch"]) == 1
    # With a relay the acks leave, and the receiver says they move again.
    caplog.set_level(logging.INFO, logger="ackd.ack_watch")
    with again.relay():
        wait_for(lambda: again.ack_watch.check(now=True).pending == 0)  # type: ignore[union-attr]
    assert not again.ack_watch.stuck
    assert registry.get_sample_value("condmsg_receiver_outbox_pending_acks") == 0
    assert any("published again" in r.getMessage() for r in caplog.records)
