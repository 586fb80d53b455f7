"""A decision is reproducible from its own row and the acks received before it.

For every decided CM: ``effective_at >= sent_at``, ``decided_at >=`` the receipt of every
counted ack, and ``evaluate(condition, sent_at, counted acks, effective_at)`` is the
stored verdict. The decision instant is read once the batch holds its CM rows' locks
(a batch that waited for them must not decide earlier than the batch it waited for), and
the effective instant ``decided_at - ack_grace`` is clamped to ``sent_at``.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pika
import pytest
import sqlalchemy as sa

from condmsg import Destination, DestinationSet, tables
from condmsg.core import protocol
from condmsg.core.acks import Ack, AckKind
from condmsg.core.evaluation import evaluate
from condmsg.core.outcome import Outcome
from condmsg.core.timeutil import utcnow
from condmsg.runtime.topology import declare_service_queue
from evaluator import store as evaluator_store
from evaluator.config import EvaluatorConfig
from evaluator.service import Evaluator
from outbox.table import outbox_table
from tests.integration.condmsg_helpers import SECRET
from tests.integration.evaluator import test_evaluator_intake as intake_tests
from tests.integration.evaluator.test_evaluator_intake import GRACE, Store, ack
from tests.waiting import wait_for

pytestmark = [pytest.mark.postgres]

make_store = intake_tests.make_store
store = intake_tests.store


def _check_invariants(engine: sa.Engine) -> int:
    """Assert the invariants for every decided CM of the store; returns how many."""
    with engine.connect() as conn:
        cms = [r for r in conn.execute(sa.select(tables.cms)) if r.state != "pending"]
        acks = list(
            conn.execute(
                sa.select(tables.acks).where(tables.acks.c.status == tables.AckStatus.COUNTED.value)
            )
        )
    by_cm: dict[str, list[Any]] = {}
    for row in acks:
        by_cm.setdefault(row.cm_id, []).append(row)
    for cm in cms:
        sent_at = evaluator_store.to_utc(cm.sent_at)
        decided_at = evaluator_store.to_utc(cm.decided_at)
        effective_at = evaluator_store.to_utc(cm.effective_at)
        assert effective_at >= sent_at, cm.cm_id
        counted = by_cm.get(cm.cm_id, [])
        for row in counted:
            assert evaluator_store.to_utc(row.received_at) <= decided_at, (cm.cm_id, row.ack_id)
        evidence = [
            Ack(
                destination=r.destination,
                kind=AckKind(r.kind),
                read_at=evaluator_store.to_utc(r.read_at),
                committed_at=evaluator_store.to_utc(r.committed_at) if r.committed_at else None,
                recipient=r.recipient,
            )
            for r in counted
        ]
        condition = evaluator_store.parse_condition(cm.condition_json)
        verdict = evaluate(condition, sent_at, evidence, effective_at).verdict
        assert verdict.value == cm.state, cm.cm_id
    return len(cms)


def test_a_batch_that_waited_for_the_locks_decides_after_the_one_it_waited_for(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch B starts first but waits (for the CM's row lock, here held back on purpose)
    while batch A stores an ack of the same CM; B then decides the CM with A's ack
    counted, and so no earlier than A received it."""
    s = store
    q = s.queue
    both = DestinationSet(
        Destination(f"{q}.a", pickup_within=timedelta(seconds=10)),
        Destination(f"{q}.b", pickup_within=timedelta(seconds=10)),
    )
    s.clock.at = utcnow() - timedelta(seconds=2)
    cm = s.sender.send(b"x", both)
    read = s.clock.at + timedelta(milliseconds=500)
    waiting, go = threading.Event(), threading.Event()
    evaluator = Evaluator(
        EvaluatorConfig(
            amqp_url="amqp://unused",
            sender=s.name,
            secret=SECRET,
            ack_grace=GRACE,
            relay=False,
            sweeps=False,
        ),
        engine=s.engine,
    )
    decisions = evaluator.store.decisions
    load_cms = decisions.load_cms

    def held_back(session: Any, cm_ids: Any, *, lock: bool = False) -> Any:
        if threading.current_thread().name == "batch-b":
            waiting.set()
            go.wait(10)
        return load_cms(session, cm_ids, lock=lock)

    monkeypatch.setattr(decisions, "load_cms", held_back)
    decided: list[int] = []
    b = threading.Thread(
        target=lambda: decided.append(evaluator.process_bodies([ack(cm, f"{q}.b", read)])),
        name="batch-b",
    )
    b.start()
    assert waiting.wait(10)
    assert evaluator.process_bodies([ack(cm, f"{q}.a", read)]) == 0  # batch A
    go.set()
    b.join(10)
    assert decided == [1]
    assert _check_invariants(s.engine) == 1


def test_the_effective_instant_is_never_before_the_cm_was_sent(store: Store) -> None:
    """Acks that settle a CM within the grace of its sending: ``decided_at - grace`` lies
    before ``sent_at``, so the decision takes effect at ``sent_at`` (row and outcome)."""
    s = store
    q = s.queue
    sent = s.clock.at
    cm = s.sender.send(b"x", Destination(q, pickup_within=timedelta(seconds=10)))
    s.clock.at = sent + GRACE / 4
    evaluator = s.evaluator()
    assert evaluator.process_bodies([ack(cm, q, sent + GRACE / 8)]) == 1
    (row,) = s.rows(tables.cms)
    assert row.state == "satisfied"
    assert evaluator_store.to_utc(row.effective_at) == sent
    assert evaluator_store.to_utc(row.decided_at) == s.clock.at
    outbox = outbox_table()
    (body,) = [
        r.body for r in s.rows(outbox, outbox.c.routing_key == protocol.outcome_queue(s.name))
    ]
    outcome = Outcome.from_json(body)
    assert (outcome.effective_at, outcome.decided_at) == (sent, s.clock.at)
    assert _check_invariants(s.engine) == 1


@pytest.mark.rabbitmq
def test_decisions_of_racing_storing_threads_and_sweeps_are_reproducible(
    pg_url: str, unique_name: str, make_sender: Any, amqp_url: str
) -> None:
    """Two storing threads and the deadline sweep race over CMs whose acks arrive at once,
    late, or never: every decision satisfies the invariants."""
    name = unique_name.replace(".", "-")
    sender = make_sender(pg_url, name, declare_queues=False)
    q = f"{unique_name}.q"
    pair = DestinationSet(
        Destination(f"{q}.a", pickup_within=timedelta(milliseconds=1500)),
        Destination(f"{q}.b", pickup_within=timedelta(milliseconds=1500)),
    )
    service = Evaluator(
        EvaluatorConfig(
            amqp_url=amqp_url,
            sender=name,
            secret=SECRET,
            ack_grace=timedelta(milliseconds=50),
            relay=False,
            batch_size=3,
            prefetch=12,
            store_threads=2,
            sweep_interval_s=0.05,
        ),
        engine=sender.engine,
    )
    count = 60
    with pika.BlockingConnection(pika.URLParameters(amqp_url)) as connection:
        channel = connection.channel()
        declare_service_queue(channel, protocol.ack_queue(name))

        def publish(cm_id: str, destination: str) -> None:
            body = ack(cm_id, destination, utcnow())
            channel.basic_publish("", protocol.ack_queue(name), body)

        with service:
            cms = []
            for i in range(count):
                cm_id = sender.send(b"x", pair)
                cms.append(cm_id)
                if i % 3 != 2:  # at once: decided within the grace of the sending
                    publish(cm_id, f"{q}.a")
                if i % 3 == 0:
                    publish(cm_id, f"{q}.b")
            # The second ack of a third of them near their deadline, racing the sweeps.
            for i, cm_id in enumerate(cms):
                if i % 3 == 1 and i % 2 == 0:
                    publish(cm_id, f"{q}.b")

            def all_decided() -> bool:
                total = sum(
                    service.registry.get_sample_value(
                        "condmsg_evaluator_decisions_total", {"verdict": v}
                    )
                    or 0
                    for v in ("satisfied", "violated")
                )
                return total == count

            wait_for(all_decided, timeout=60)
    assert _check_invariants(sender.engine) == count
