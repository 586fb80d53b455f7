"""The evaluator's ack intake on the real stores: batches with every kind of ack, racing
instances, and the consuming service settling batches stored by several threads.

Most tests call ``Evaluator.process_bodies`` directly (one batch, one transaction), once
on SQLite and once on PostgreSQL, whose batch statements take another path (array
parameters, and one plain parameter for a column a whole batch shares).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pika
import pytest
import sqlalchemy as sa

from condmsg import Destination, DestinationSet, tables
from condmsg.core import protocol
from condmsg.core.acks import AckKind
from condmsg.core.outcome import Outcome
from condmsg.core.timeutil import utcnow
from condmsg.runtime.topology import declare_service_queue
from evaluator.config import EvaluatorConfig
from evaluator.consume import InOrder
from evaluator.service import Evaluator
from outbox.table import outbox_table
from tests.integration.condmsg_helpers import SECRET, Clock, ack_body
from tests.waiting import wait_for

pytestmark = [pytest.mark.postgres]

GRACE = timedelta(milliseconds=100)


@dataclass
class Store:
    engine: sa.Engine
    sender: Any
    clock: Clock
    name: str
    queue: str

    def evaluator(self, instance: str = "ev-1", **options: Any) -> Evaluator:
        return Evaluator(
            EvaluatorConfig(
                amqp_url=self.sender.amqp_url,
                sender=self.name,
                secret=SECRET,
                ack_grace=GRACE,
                relay=False,
                instance=instance,
                **options,
            ),
            engine=self.engine,
            clock=self.clock,
        )

    def rows(self, table: sa.Table, *where: Any) -> list[Any]:
        with self.engine.connect() as conn:
            return list(conn.execute(sa.select(table).where(*where)))


def ack(cm_id: str, destination: str, at: datetime, **overrides: Any) -> bytes:
    return ack_body(cm_id, destination, at, **({"receiver": "rx-1"} | overrides))


@pytest.fixture
def make_store(unique_name: str, make_sender: Any) -> Any:
    made: list[Store] = []

    def factory(db_url: str) -> Store:
        name = unique_name.replace(".", "-")
        clock = Clock(utcnow())
        sender = make_sender(db_url, name, clock=clock, declare_queues=False)
        made.append(Store(sender.engine, sender, clock, name, f"{unique_name}.q"))
        return made[-1]

    yield factory
    for s in made:
        s.engine.dispose()


@pytest.fixture
def store(db_url: str, make_store: Any) -> Store:
    return make_store(db_url)  # type: ignore[no-any-return]


def _outcomes(s: Store) -> list[Outcome]:
    outbox = outbox_table()
    rows = s.rows(outbox, outbox.c.routing_key == protocol.outcome_queue(s.name))
    return [Outcome.from_json(r.body) for r in rows]


def test_one_batch_with_every_kind_of_ack(store: Store) -> None:
    s = store
    q = s.queue
    sent = s.clock.at
    quick = Destination(q, pickup_within=timedelta(seconds=10))
    cms = [s.sender.send(b"x", quick) for _ in range(6)]
    s.clock.at = sent + timedelta(seconds=1)
    read = sent + timedelta(milliseconds=500)
    first = ack(cms[0], q, read)
    bodies = [
        first,
        first,  # the same ack twice in one batch
        ack(cms[1], q, read, receiver="rx-2"),  # another receiver: a varying column
        ack(cms[2], q, read, token="0" * 64),  # forged
        ack(cms[3], "elsewhere", read),  # no such destination
        ack(str(uuid.uuid4()), q, read),  # no such CM
        ack(
            cms[4],
            q,
            read,
            kind=AckKind.COMMIT,
            committed_at=read + timedelta(milliseconds=1),
        ),
        # A NUL, which no PostgreSQL text can hold, in an id or a name: dead-lettered
        # rather than failing the batch (and its every redelivery).
        nul_id := ack(cms[5][:8] + "\x00" + cms[5][8:], q, read),
        nul_receiver := ack(cms[5], q, read, receiver="rx\x00"),
        b"{not json",
    ]
    evaluator = s.evaluator()
    assert evaluator.process_bodies(bodies) == 3
    states = {r.cm_id: r for r in s.rows(tables.cms)}
    assert {c for c in cms if states[c].state == "satisfied"} == {cms[0], cms[1], cms[4]}
    assert all(states[c].decided_by == "ev-1" for c in (cms[0], cms[1], cms[4]))
    assert all(states[c].next_check_at is None for c in (cms[0], cms[1], cms[4]))
    assert {states[c].state for c in (cms[2], cms[3], cms[5])} == {"pending"}
    kinds = Counter(r.kind for r in s.rows(tables.anomalies))
    assert kinds == {
        "duplicate": 1,
        "bad_token": 1,
        "wrong_destination": 1,
        "unknown_cm": 1,
        "malformed": 3,  # each dead letter, recorded beside its outbox row
    }
    malformed = [r.detail for r in s.rows(tables.anomalies) if r.kind == "malformed"]
    assert any(d.endswith("; body (9 bytes): {not json") for d in malformed)
    stored = {r.cm_id: r for r in s.rows(tables.acks)}
    assert set(stored) == {cms[0], cms[1], cms[4]}
    assert stored[cms[1]].receiver == "rx-2" and stored[cms[0]].receiver == "rx-1"
    assert stored[cms[4]].kind == "commit" and stored[cms[4]].committed_at is not None
    assert {r.status for r in stored.values()} == {"counted"}
    dead = s.rows(
        outbox_table(), outbox_table().c.routing_key == protocol.dead_letter_queue(s.name)
    )
    assert [r.body for r in dead] == [nul_id, nul_receiver, b"{not json"]
    assert "NUL" in dead[0].headers[protocol.H_REASON]
    # One outcome per decided CM, the same document the CM row holds.
    outcomes = {o.cm_id: o for o in _outcomes(s)}
    assert set(outcomes) == {cms[0], cms[1], cms[4]}
    for cm_id, outcome in outcomes.items():
        row = states[cm_id]
        assert outcome.verdict.value == row.state
        assert list(outcome.reasons) == json.loads(row.reasons_json)
        assert list(outcome.facts) == json.loads(row.facts_json)
        assert outcome.effective_at == s.clock.at - GRACE


def test_redelivered_and_late_acks(store: Store) -> None:
    s = store
    q = s.queue
    sent = s.clock.at
    both = DestinationSet(
        Destination(f"{q}.a", pickup_within=timedelta(seconds=10)),
        Destination(f"{q}.b", pickup_within=timedelta(seconds=10)),
    )
    cm = s.sender.send(b"x", both)
    early = ack(cm, f"{q}.a", sent + timedelta(seconds=1))
    evaluator = s.evaluator()
    s.clock.at = sent + timedelta(seconds=2)
    assert evaluator.process_bodies([early]) == 0  # still waits for b
    assert evaluator.process_bodies([early]) == 0  # redelivered: stored before
    s.clock.at = sent + timedelta(seconds=30)
    assert evaluator.sweep() == 1  # b never read: violated at the deadline
    late = ack(cm, f"{q}.b", sent + timedelta(seconds=3))  # in time, but after the decision
    assert evaluator.process_bodies([late]) == 0
    (row,) = s.rows(tables.cms)
    assert row.state == "violated"
    statuses = sorted(r.status for r in s.rows(tables.acks))
    assert statuses == ["changes_verdict", "counted"]
    kinds = Counter(r.kind for r in s.rows(tables.anomalies))
    assert kinds == {"duplicate": 1, "late_changes_verdict": 1}
    assert [o.verdict.value for o in _outcomes(s)] == ["violated"]


def test_racing_instances_decide_each_cm_once(pg_url: str, make_store: Any) -> None:
    """Three instances take the same acks at once (PostgreSQL: row locks, one writer per
    CM): each CM is decided once, with one outcome, and every other copy of an ack is a
    duplicate."""
    s = make_store(pg_url)
    q = s.queue
    sent = s.clock.at
    quick = Destination(q, pickup_within=timedelta(seconds=10))
    cms = [s.sender.send(b"x", quick) for _ in range(60)]
    s.clock.at = sent + timedelta(seconds=1)
    bodies = [ack(c, q, sent + timedelta(milliseconds=500)) for c in cms]
    evaluators = [s.evaluator(f"ev-{i}") for i in range(3)]
    decided: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(len(evaluators))

    def run(evaluator: Evaluator, order: int) -> None:
        try:
            start.wait()
            # Each instance takes every ack, in its own order and batches.
            half = len(bodies) // 2
            mine = [bodies, bodies[::-1], bodies[half:] + bodies[:half]][order]
            for i in range(0, len(mine), 7):
                decided.append(evaluator.process_bodies(mine[i : i + 7]))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(e, i)) for i, e in enumerate(evaluators)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert sum(decided) == len(cms)
    rows = s.rows(tables.cms)
    assert {r.state for r in rows} == {"satisfied"}
    assert {r.decided_by for r in rows} <= {"ev-0", "ev-1", "ev-2"}
    outcomes = Counter(o.cm_id for o in _outcomes(s))
    assert outcomes == dict.fromkeys(cms, 1)
    assert len(s.rows(tables.acks)) == len(cms)
    kinds = Counter(r.kind for r in s.rows(tables.anomalies))
    assert kinds == {"duplicate": 2 * len(cms)}


def test_batches_are_settled_in_delivery_order() -> None:
    order = InOrder()
    first, second, third = order.open(10), order.open(20), order.open(30)
    assert order.finished(second, True) == []  # the first is still being stored
    assert order.finished(first, True) == [(10, True), (20, True)]
    assert order.finished(third, False) == [(30, False)]
    assert order.unsettled == 0
    a, b = order.open(40), order.open(50)
    assert order.finished(b, False) == []
    assert order.finished(a, True) == [(40, True), (50, False)]


@pytest.mark.rabbitmq
def test_the_service_takes_in_a_stream_of_small_batches(
    pg_url: str, unique_name: str, make_sender: Any, amqp_url: str
) -> None:
    """Many batches, stored by two threads out of order, all settled: every CM decided
    once and no ack redelivered (a redelivery would show as a duplicate anomaly)."""
    name = unique_name.replace(".", "-")
    sender = make_sender(pg_url, name, declare_queues=False)
    q = f"{unique_name}.q"
    quick = Destination(q, pickup_within=timedelta(minutes=1))
    cms = [sender.send(b"x", quick) for _ in range(150)]
    now = utcnow()
    service = Evaluator(
        EvaluatorConfig(
            amqp_url=amqp_url,
            sender=name,
            secret=SECRET,
            relay=False,
            batch_size=8,
            prefetch=16,
            store_threads=2,
            sweep_interval_s=3600,
        ),
        engine=sender.engine,
    )
    with pika.BlockingConnection(pika.URLParameters(amqp_url)) as connection:
        channel = connection.channel()
        declare_service_queue(channel, protocol.ack_queue(name))
        service.start()
        try:
            for cm_id in cms:
                channel.basic_publish("", protocol.ack_queue(name), ack(cm_id, q, now))

            def decided() -> bool:
                value = service.registry.get_sample_value(
                    "condmsg_evaluator_decisions_total", {"verdict": "satisfied"}
                )
                return value == len(cms)

            wait_for(decided, timeout=60)
        finally:
            service.stop()
        remaining = channel.queue_declare(protocol.ack_queue(name), passive=True).method
        assert remaining.message_count == 0
    with sender.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(tables.anomalies)).scalar() == 0
        states = Counter(r.state for r in conn.execute(sa.select(tables.cms.c.state)))
    assert states == {"satisfied": len(cms)}
