"""The whole loop in one process: sender, receivers, relays and the evaluator on the real
RabbitMQ and PostgreSQL, with the paper's examples scaled (a day becomes a second)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pika
import pytest
import sqlalchemy as sa

from condmsg import Destination, Verdict, tables
from condmsg.core import protocol
from condmsg.core.protocol import MessageKind
from evaluator.service import Evaluator
from tests.integration.condmsg_helpers import SECRET, get_all
from tests.running_world import RunningWorld
from tests.waiting import wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

DAY = timedelta(seconds=1)


@dataclass
class World:
    sender: Any
    evaluator: Evaluator
    queue: Any  # callable: short name -> queue name
    make_receiver: Any
    name: str
    pg_url: str


@pytest.fixture
def world(running_world: RunningWorld, make_receiver: Any) -> World:
    w = running_world
    return World(w.sender, w.evaluator, w.queue, make_receiver, w.name, w.pg_url)


def _commit_read(receiver: Any, queue: str) -> Any:
    with receiver.transaction() as tx:
        return tx.read(queue, timeout=5)


def test_example1_success_notices_reach_every_destination(world: World, example1: Any) -> None:
    w = world
    cm_id = w.sender.send(b"meeting", example1(w.queue, DAY), notify_success=True)
    rx = w.make_receiver(w.pg_url, "alice")
    with rx.relay():
        assert _commit_read(rx, w.queue("qr3")) is not None
        assert _commit_read(rx, w.queue("qr1")) is not None
        assert rx.read(w.queue("qr2"), timeout=5) is not None
        assert _commit_read(rx, w.queue("qr4")) is not None
        outcome = w.sender.outcome(cm_id, timeout=10)
    assert outcome is not None
    assert outcome.verdict is Verdict.SATISFIED
    # Decided on the last needed ack, long before any deadline.
    assert outcome.effective_at - outcome.decided_at == -timedelta(milliseconds=100)
    notices = [rx.read(w.queue(q), timeout=5) for q in ("qr1", "qr2", "qr3", "qr4")]
    assert [n.kind for n in notices if n] == [MessageKind.SUCCESS] * 4
    pushed = list(w.sender.outcomes(timeout=2))
    assert [(o.cm_id, o.verdict) for o in pushed] == [(cm_id, Verdict.SATISFIED)]


def test_example1_fails_when_qr3_misses_its_processing_deadline(
    world: World, example1: Any
) -> None:
    w = world
    cm_id = w.sender.send(b"meeting", example1(w.queue, DAY), compensation=b"meeting cancelled")
    rx = w.make_receiver(w.pg_url, "alice")
    with rx.relay():
        for q in ("qr1", "qr4"):
            assert _commit_read(rx, w.queue(q)) is not None
        assert rx.read(w.queue("qr3"), timeout=5) is not None  # read, never processed
        outcome = w.sender.outcome(cm_id, timeout=10)
    assert outcome is not None
    assert outcome.verdict is Verdict.VIOLATED
    assert any("'" + w.queue("qr3") + "'" in r and "never processed" in r for r in outcome.reasons)
    # qr3, qr1, qr4 consumed the original and get the compensation; qr2 never read it, so
    # its original and compensation cancel out in its receiver log.
    for q in ("qr3", "qr1", "qr4"):
        comp = rx.read(w.queue(q), timeout=5)
        assert comp is not None and comp.kind is MessageKind.COMPENSATION
        assert comp.payload == b"meeting cancelled"
    assert rx.read(w.queue("qr2"), timeout=1) is None
    assert rx.stats.cancelled == 1 and rx.stats.discards == 1


def test_example1_fails_at_the_evaluation_deadline_when_a_pickup_is_missing(
    world: World, example1: Any
) -> None:
    w = world
    sent = time.monotonic()
    cm_id = w.sender.send(b"meeting", example1(w.queue, DAY))
    rx = w.make_receiver(w.pg_url, "alice")
    with rx.relay():
        for q in ("qr3", "qr1", "qr2"):
            assert _commit_read(rx, w.queue(q)) is not None
        # qr4 never reads: min_process holds (qr1, qr2), but "all four must read" waits
        # for a transactional reader until the evaluation deadline (7 "days"): no outcome
        # before it (however long the reads above took), one soon after.
        before_deadline = 7 * DAY.total_seconds() - (time.monotonic() - sent) - 0.5
        if before_deadline > 0:
            assert w.sender.outcome(cm_id, timeout=before_deadline) is None
        outcome = w.sender.outcome(cm_id, timeout=15)
    assert outcome is not None
    assert outcome.verdict is Verdict.VIOLATED
    assert outcome.reasons[0].startswith("evaluation timeout")
    with w.sender.engine.connect() as conn:
        row = conn.execute(sa.select(tables.cms)).one()
    assert row.effective_at.timestamp() >= (row.sent_at + 7 * DAY).timestamp()


def test_example2_three_competing_controllers(world: World) -> None:
    w = world
    queue = w.queue("qcentral")
    condition = Destination(
        queue, pickup_within=timedelta(seconds=20), evaluation_timeout=timedelta(seconds=21)
    )
    cm_ids = [w.sender.send(f"flight {i}".encode(), condition) for i in range(6)]
    controllers = [w.make_receiver(w.pg_url, f"controller-{i}") for i in range(3)]
    got: list[Any] = []
    lock = threading.Lock()

    def work(rx: Any) -> None:
        while (m := rx.read(queue, timeout=1)) is not None:
            with lock:
                got.append(m)

    with controllers[0].relay():
        threads = [threading.Thread(target=work, args=(c,)) for c in controllers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        outcomes = [w.sender.outcome(cm_id, timeout=10) for cm_id in cm_ids]
    assert sorted(m.cm_id for m in got) == sorted(cm_ids)
    assert [o.verdict if o else None for o in outcomes] == [Verdict.SATISFIED] * 6


def test_example2_fails_when_no_controller_picks_up(world: World) -> None:
    w = world
    condition = Destination(
        w.queue("qcentral"),
        pickup_within=timedelta(milliseconds=500),
        evaluation_timeout=timedelta(milliseconds=600),
    )
    cm_id = w.sender.send(b"flight LH400", condition)
    outcome = w.sender.outcome(cm_id, timeout=10)
    assert outcome is not None
    assert outcome.verdict is Verdict.VIOLATED
    lateness = outcome.decided_at - (outcome.effective_at + timedelta(milliseconds=100))
    assert lateness == timedelta(0)
    facts = outcome.facts[0]
    assert facts["destination"] == w.queue("qcentral") and facts["acks"] == 0


def test_bad_acks_are_anomalies_or_dead_letters_and_never_count(
    world: World, channel: Any, sqlite_url: str
) -> None:
    w = world
    queue = w.queue("q")
    cm_id = w.sender.send(b"x", Destination(queue, pickup_within=timedelta(seconds=30)))
    # A store of its own with no relay: this receiver's real ack never leaves, so only the
    # acks the test publishes by hand reach the evaluator.
    rx = w.make_receiver(sqlite_url, "alice")
    message = rx.read(queue, timeout=5)
    assert message is not None
    ack_queue = protocol.ack_queue(w.name)
    genuine = {
        "v": 1,
        "ack_id": uuid.uuid4().hex,
        "cm_id": cm_id,
        "destination": queue,
        "recipient": "alice",
        "receiver": "r",
        "kind": "read",
        "read_at": protocol.format_instant(message.read_at),
        "committed_at": None,
        "token": protocol.copy_token(SECRET, cm_id, queue, None),
    }
    bodies = [
        b"{not json",
        json.dumps({**genuine, "ack_id": "f1", "token": "ab" * 32}).encode(),
        json.dumps({**genuine, "ack_id": "u1", "cm_id": str(uuid.uuid4())}).encode(),
        json.dumps({**genuine, "ack_id": "w1", "destination": "elsewhere"}).encode(),
    ]
    for body in bodies:
        channel.basic_publish("", ack_queue, body, pika.BasicProperties(delivery_mode=2))

    def anomalies() -> dict[str, int]:
        with w.sender.engine.connect() as conn:
            rows = conn.execute(sa.select(tables.anomalies.c.kind)).all()
        counts: dict[str, int] = {}
        for (kind,) in rows:
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    wait_for(lambda: len(anomalies()) == 4, timeout=10)
    assert anomalies() == {"bad_token": 1, "unknown_cm": 1, "wrong_destination": 1, "malformed": 1}
    dead = get_all(channel, protocol.dead_letter_queue(w.name))
    assert [body for _, body in dead] == [b"{not json"]
    assert "not JSON" in dead[0][0].headers[protocol.H_REASON]
    assert w.sender.outcome(cm_id) is None  # nothing forged counted

    # The genuine ack decides it; sending it twice records a duplicate.
    for _ in range(2):
        channel.basic_publish("", ack_queue, json.dumps(genuine).encode())
    outcome = w.sender.outcome(cm_id, timeout=10)
    assert outcome is not None and outcome.verdict is Verdict.SATISFIED
    wait_for(lambda: anomalies().get("duplicate") == 1, timeout=10)
