"""Contract: the async receiver writes the sync receiver's rows (RLOG, COMMIT and READ acks,
failed attempts) for the same deliveries, on SQLite and on PostgreSQL.

One scenario (a transactional read, a non-transactional one, a cancel-out, a rollback and
its retry, a duplicate, a compensation after the read) runs once with each receiver, both
on a fixed clock, on queues and CMs of their own in one store; the rows each left are
compared with the CM ids, queues and random ids replaced by what they stand for. On
PostgreSQL the two write through different statements (the sync psycopg fast path, the
async receiver's psycopg pipelines) and must still leave the same rows.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa

from ackd.receiver_store import SqlAlchemyReceiverStore
from ackd.receiver_store_psycopg import PsycopgReceiverStore
from ackd.tables import poison, rlog
from condmsg.core.protocol import MessageKind
from outbox.table import outbox_table
from tests.integration.cancel_out_race import send_compensation
from tests.integration.condmsg_helpers import publish_original
from tests.waiting import wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
STEPS = ("committed", "read", "cancelled", "retried")


class _Rollback(Exception):
    """The app's failure in the retried step."""


def _scenario(receiver: Any, queue: str, channel: Any) -> dict[str, str]:
    """Run the scenario on ``receiver``; its CM ids by step."""
    receiver._broker.ensure_queue(queue)
    cm = {step: publish_original(channel, queue) for step in ("committed",)}
    with receiver.transaction() as tx:
        assert tx.read(queue, timeout=5) is not None
    cm["read"] = publish_original(channel, queue)
    assert receiver.read(queue, timeout=5) is not None
    cm["cancelled"] = publish_original(channel, queue)
    send_compensation(channel, queue, cm["cancelled"])
    assert receiver.read(queue, timeout=1.0) is None  # both dropped
    cm["retried"] = publish_original(channel, queue)

    def fail_once() -> None:
        with receiver.transaction() as tx:
            assert tx.read(queue, timeout=5) is not None
            raise _Rollback("the app failed once")

    with pytest.raises(_Rollback):
        fail_once()

    def retry() -> bool | None:
        with receiver.transaction() as tx:
            return True if tx.read(queue, timeout=0.5) is not None else None

    wait_for(retry, timeout=10, what="the retried original back after its backoff")
    publish_original(channel, queue, cm["committed"])  # a second copy: dropped by the RLOG
    send_compensation(channel, queue, cm["committed"])  # after the read: the app gets it
    undo = receiver.read(queue, timeout=5)
    assert undo is not None and undo.kind is MessageKind.COMPENSATION
    assert receiver.read(queue, timeout=0.5) is None
    return cm


def _rows(engine: sa.Engine, queue: str, cm: dict[str, str]) -> dict[str, Any]:
    """What the scenario left in the store, told by step instead of by id."""
    step_of = {cm_id: step for step, cm_id in cm.items()}
    outbox = outbox_table()
    with engine.connect() as conn:
        rlog_rows = conn.execute(
            sa.select(rlog).where(rlog.c.destination == queue).order_by(rlog.c.read_at)
        ).all()
        acks = conn.execute(
            sa.select(outbox).where(outbox.c.correlation_id.in_(list(cm.values())))
        ).all()
        attempts = conn.execute(sa.select(poison.c.attempts, poison.c.last_error)).all()
    rlog_by_step = {
        step_of[row.cm_id]: {
            k: v for k, v in row._mapping.items() if k not in ("cm_id", "destination", "message_id")
        }
        for row in rlog_rows
    }
    ack_by_step: dict[str, Any] = {}
    for row in acks:
        doc = json.loads(row.body)
        step = step_of[doc.pop("cm_id")]
        ack_by_step[step] = {
            "doc": {k: v for k, v in doc.items() if k not in ("ack_id", "token", "destination")},
            "row": (row.exchange, row.content_type, row.message_type, row.persistent),
        }
    return {
        "rlog": rlog_by_step,
        "acks": ack_by_step,
        "attempts": sorted((a, e) for a, e in attempts if "the app failed once" in (e or "")),
    }


def test_the_async_receiver_writes_the_sync_receivers_rows(
    db_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    from ackd import AsyncReceiver
    from tests.integration.receiver_kinds import AsyncReceiverDriver

    options: dict[str, Any] = {"receiver_id": "rx-contract", "clock": lambda: NOW}
    sync = make_receiver(db_url, **options)
    twin = make_receiver(db_url, **options)
    driver = AsyncReceiverDriver(
        twin, AsyncReceiver(twin.config, recipient=twin.recipient, clock=lambda: NOW)
    )
    # On PostgreSQL the sync receiver takes its psycopg fast path; the async one always
    # runs the portable adapter's statements: both are held to the same rows.
    on_pg = db_url.startswith("postgresql")
    assert isinstance(sync.store, PsycopgReceiverStore) == on_pg
    assert isinstance(driver.call(driver._receiver._started()).store, SqlAlchemyReceiverStore)
    try:
        sync_cm = _scenario(sync, f"{unique_name}.q", channel)
        sync_rows = _rows(sync.engine, f"{unique_name}.q", sync_cm)
        with sync.engine.begin() as conn:  # the async run counts its own attempt
            conn.execute(sa.delete(poison))
        async_cm = _scenario(driver, f"{unique_name}.q2", channel)
        async_rows = _rows(sync.engine, f"{unique_name}.q2", async_cm)
    finally:
        driver.close()
    assert set(sync_rows["rlog"]) == set(STEPS)
    assert set(sync_rows["acks"]) == {"committed", "read", "retried"}
    assert sync_rows["attempts"] == [(1, sync_rows["attempts"][0][1])]
    assert async_rows == sync_rows
