"""What the harness sees of the acks of the receiver under test: the acks the harness's
evaluator received for a CM (counted or recorded as anomalies), why it refused some, and
a wait until every ack the receiver committed so far has arrived."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import timedelta

import sqlalchemy as sa

from condmsg import Destination
from condmsg import tables as sender_tables
from condmsg.conformance.world import World
from outbox.table import DEFAULT_TABLE_NAME as OUTBOX_TABLE

#: CM ids per query (an ``IN`` list of bounded length).
CHUNK = 500


def ack_ids(w: World, cm_ids: Iterable[str]) -> dict[str, set[str]]:
    """The ids of the acks the evaluator received for each of ``cm_ids``, counted or not
    (an ack for an unknown CM, a duplicate, a wrong recipient are anomalies)."""
    wanted = list(cm_ids)
    found: dict[str, set[str]] = {cm_id: set() for cm_id in wanted}
    with w.sender.engine.connect() as conn:
        for start in range(0, len(wanted), CHUNK):
            chunk = wanted[start : start + CHUNK]
            for table in (sender_tables.acks, sender_tables.anomalies):
                query = sa.select(table.c.cm_id, table.c.ack_id).where(
                    table.c.cm_id.in_(chunk), table.c.ack_id.is_not(None)
                )
                for cm_id, ack_id in conn.execute(query):
                    found[cm_id].add(ack_id)
    return found


def refused(w: World, cm_id: str) -> list[str]:
    """Why the evaluator did not count acks it got for ``cm_id`` (its anomalies)."""
    table = sender_tables.anomalies
    query = sa.select(table.c.kind, table.c.detail).where(table.c.cm_id == cm_id)
    with w.sender.engine.connect() as conn:
        return [f"{kind}: {detail}" for kind, detail in conn.execute(query)]


def traceparents(w: World, cm_id: str) -> list[str]:
    """The W3C traceparents the acks of ``cm_id`` carried (the evaluator keeps a
    well-formed one with each ack it stores)."""
    table = sender_tables.acks
    query = sa.select(table.c.traceparent).where(
        table.c.cm_id == cm_id, table.c.traceparent.is_not(None)
    )
    with w.sender.engine.connect() as conn:
        return [str(traceparent) for traceparent in conn.scalars(query)]


def flush(w: World) -> None:
    """Wait until every ack the receiver committed so far has reached the evaluator: its
    outbox holds none left to relay, then the ack of a fresh original published behind
    them is in (the relay publishes in order, the one evaluator stores in order)."""
    w.settle(0.0)
    w.wait_for(lambda: _unrelayed(w) == 0, w.scaled(15), "the receiver's outbox to drain")
    cm_id = str(uuid.uuid4())
    condition = Destination(w.config.queue, pickup_within=timedelta(minutes=5))
    for message in w.copies(cm_id, condition, b"flush"):
        w.publish(message)
    w.wait_for(
        lambda: ack_ids(w, [cm_id])[cm_id],
        w.scaled(15),
        "the ack of an original sent behind the others to reach the evaluator",
    )


def _unrelayed(w: World) -> int:
    with w.store.connect() as conn:
        query = sa.text(f"SELECT count(*) FROM {OUTBOX_TABLE} WHERE state = 'pending'")
        return int(conn.execute(query).scalar_one())


def copy_message_id(w: World, cm_id: str) -> str:
    """The message id the sender gave the CM's copy (a sequence's id)."""
    copies = sender_tables.copies
    with w.sender.engine.connect() as conn:
        query = sa.select(copies.c.message_id).where(copies.c.cm_id == cm_id)
        return str(conn.execute(query).scalar_one())
