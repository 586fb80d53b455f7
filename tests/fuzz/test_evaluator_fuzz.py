"""Fuzzing the evaluator's ack intake on the real RabbitMQ and PostgreSQL.

One ``Evaluator`` runs for the whole test; each hypothesis example is a batch: genuine
acks of real CMs, published to the sender's ack queue interleaved with generated bad
bodies, forged acks and clock-skewed acks of other real CMs. Property, per batch:

- every genuine ack is stored and counted, and its CM is decided on it (satisfied);
- every malformed body is in ``condmsg.<sender>.dead`` with a ``condmsg-reason``, or, if
  it is a well-formed document after all, recorded as an anomaly (its CM is unknown);
- a forged ack (token of another copy) is a ``bad_token`` anomaly and an ack outside the
  clock-skew tolerance a ``clock_skew`` anomaly; neither decides its CM, which stays
  pending (its deadline is a minute away);
- the evaluator's thread is still running.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pika
import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from condmsg import Destination, tables
from condmsg.core import protocol
from condmsg.core.acks import AckKind
from condmsg.core.timeutil import utcnow
from evaluator.config import EvaluatorConfig
from evaluator.service import Evaluator
from tests.integration.condmsg_helpers import SECRET

from . import strategies as s
from .conftest import INTEGRATION

pytestmark = [pytest.mark.fuzz, pytest.mark.rabbitmq, pytest.mark.postgres]

#: Every CM's deadline: far beyond a batch, so no CM is decided by timeout during the test.
WINDOW = timedelta(minutes=5)
#: How long a batch may take to be stored and its dead letters relayed.
BATCH_DEADLINE_S = 30.0


@dataclass
class Rig:
    sender: Any
    evaluator: Evaluator
    channel: Any
    name: str
    queue: str


@pytest.fixture
def rig(pg_url: str, unique_name: str, make_sender: Any, amqp_url: str) -> Iterator[Rig]:
    name = unique_name.replace(".", "-")
    sender = make_sender(pg_url, name)
    evaluator = Evaluator(
        EvaluatorConfig(
            amqp_url=amqp_url,
            sender=name,
            secret=SECRET,
            batch_size=50,
            prefetch=100,
            sweep_interval_s=0.5,
        ),
        engine=sender.engine,
    )
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = connection.channel()
    evaluator.start()
    try:
        # The evaluator declares its queues as it starts consuming.
        deadline = time.monotonic() + 30
        while not _consumers(channel, protocol.ack_queue(name)):
            assert time.monotonic() < deadline, "the evaluator never consumed its ack queue"
            time.sleep(0.05)
        yield Rig(sender, evaluator, channel, name, f"{unique_name}.q")
    finally:
        evaluator.stop()
        connection.close()


def _consumers(channel: Any, queue: str) -> int:
    try:
        return int(channel.queue_declare(queue, passive=True).method.consumer_count)
    except pika.exceptions.ChannelClosedByBroker:
        channel.connection.channel()  # the passive declare closed that channel
        return 0


def genuine_ack(rig: Rig, cm_id: str, *, kind: AckKind, **overrides: Any) -> protocol.AckMessage:
    read_at = utcnow()
    fields: dict[str, Any] = {
        "ack_id": uuid.uuid4().hex,
        "cm_id": cm_id,
        "destination": rig.queue,
        "kind": kind,
        "read_at": read_at,
        "committed_at": read_at if kind is AckKind.COMMIT else None,
        "recipient": None,
        "receiver": "fuzz-rx",
        "token": protocol.copy_token(SECRET, cm_id, rig.queue, None),
    }
    return protocol.AckMessage(**(fields | overrides))


@dataclass
class Batch:
    genuine: dict[str, protocol.AckMessage]  # by CM id
    forged: dict[str, protocol.AckMessage]
    skewed: dict[str, protocol.AckMessage]
    bad: list[bytes]


def make_batch(rig: Rig, data: st.DataObject) -> tuple[Batch, list[bytes]]:
    condition = Destination(rig.queue, pickup_within=WINDOW)
    n_genuine = data.draw(st.integers(1, 6), label="genuine acks")
    n_forged = data.draw(st.integers(0, 2), label="forged acks")
    n_skewed = data.draw(st.integers(0, 2), label="clock-skewed acks")
    cm_ids = [rig.sender.send(b"x", condition) for _ in range(n_genuine + n_forged + n_skewed)]
    genuine = {
        c: genuine_ack(rig, c, kind=data.draw(st.sampled_from(list(AckKind))))
        for c in cm_ids[:n_genuine]
    }
    forged = {
        c: genuine_ack(
            rig, c, kind=AckKind.READ, token=data.draw(st.text(s.HEX, min_size=64, max_size=64))
        )
        for c in cm_ids[n_genuine : n_genuine + n_forged]
    }
    skewed: dict[str, protocol.AckMessage] = {}
    for c in cm_ids[n_genuine + n_forged :]:
        # An hour before the CM was sent, or a minute after it was received.
        offset = data.draw(st.sampled_from([timedelta(hours=-1), timedelta(minutes=1)]))
        skewed[c] = genuine_ack(rig, c, kind=AckKind.READ, read_at=utcnow() + offset)
    bad = data.draw(st.lists(s.bad_ack_bodies(), min_size=1, max_size=8), label="bad bodies")
    bodies = [a.to_json() for a in (*genuine.values(), *forged.values(), *skewed.values())]
    order = data.draw(st.permutations([*bodies, *bad]), label="order")
    return Batch(genuine, forged, skewed, bad), order


@dataclass
class Seen:
    states: dict[str, str]
    ack_status: dict[str, str]
    anomalies: dict[str, str]  # ack_id -> kind
    dead: list[tuple[bytes, str | None]]


def snapshot(rig: Rig, batch: Batch, dead: list[tuple[bytes, str | None]]) -> Seen:
    cm_ids = [*batch.genuine, *batch.forged, *batch.skewed]
    with rig.sender.engine.connect() as conn:
        states = dict(
            conn.execute(
                sa.select(tables.cms.c.cm_id, tables.cms.c.state).where(
                    tables.cms.c.cm_id.in_(cm_ids)
                )
            ).all()
        )
        statuses = dict(
            conn.execute(
                sa.select(tables.acks.c.ack_id, tables.acks.c.status).where(
                    tables.acks.c.cm_id.in_(cm_ids)
                )
            ).all()
        )
        anomalies = dict(
            conn.execute(
                # A dead letter's ``malformed`` anomaly has no ack id: its body is judged
                # by the dead-letter queue below.
                sa.select(tables.anomalies.c.ack_id, tables.anomalies.c.kind).where(
                    tables.anomalies.c.ack_id.is_not(None)
                )
            ).all()
        )
    while True:
        method, props, body = rig.channel.basic_get(
            protocol.dead_letter_queue(rig.name), auto_ack=True
        )
        if method is None:
            break
        dead.append((body, (props.headers or {}).get(protocol.H_REASON)))
    return Seen(states, statuses, anomalies, dead)


def unaccounted(batch: Batch, seen: Seen) -> list[str]:
    """What the batch's property still misses (empty once everything is as it must be)."""
    missing: list[str] = []
    for cm_id, ack in batch.genuine.items():
        if seen.ack_status.get(ack.ack_id) != "counted" or seen.states.get(cm_id) != "satisfied":
            missing.append(
                f"genuine ack {ack.ack_id} of {cm_id}: ack {seen.ack_status.get(ack.ack_id)}, "
                f"CM {seen.states.get(cm_id)}"
            )
    for label, acks, kind in (
        ("forged", batch.forged, "bad_token"),
        ("skewed", batch.skewed, "clock_skew"),
    ):
        for cm_id, ack in acks.items():
            if seen.anomalies.get(ack.ack_id) != kind:
                missing.append(
                    f"{label} ack {ack.to_json()!r}: anomaly {seen.anomalies.get(ack.ack_id)}, "
                    f"ack {seen.ack_status.get(ack.ack_id)}, CM {seen.states.get(cm_id)}"
                )
    dead = Counter(body for body, _ in seen.dead)
    for body in batch.bad:
        if dead[body] > 0:
            dead[body] -= 1
            continue
        if _ack_id(body) in seen.anomalies:
            continue
        missing.append(f"bad body neither dead-lettered nor an anomaly: {body[:300]!r}")
    return missing


def _ack_id(body: bytes) -> object:
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    ack_id = doc.get("ack_id") if isinstance(doc, dict) else None
    return ack_id if isinstance(ack_id, str) else None


@INTEGRATION
@given(data=st.data())
def test_the_evaluator_takes_genuine_acks_among_poison(rig: Rig, data: st.DataObject) -> None:
    batch, bodies = make_batch(rig, data)
    for body in bodies:
        rig.channel.basic_publish(
            "", protocol.ack_queue(rig.name), body, pika.BasicProperties(delivery_mode=2)
        )
    dead: list[tuple[bytes, str | None]] = []
    deadline = time.monotonic() + BATCH_DEADLINE_S
    while True:
        seen = snapshot(rig, batch, dead)
        missing = unaccounted(batch, seen)
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert rig.evaluator.running, "the evaluator's thread stopped"
    assert not missing, "\n".join(missing)
    assert all(reason for _, reason in seen.dead), f"a dead letter without a reason: {seen.dead}"
    # Poison never decides a CM: forged and skewed evidence leaves its CM pending.
    for cm_id in (*batch.forged, *batch.skewed):
        assert seen.states[cm_id] == "pending", (cm_id, seen.states[cm_id])
