"""Poison while CMs flow: a fault test of the whole system under bad input.

A sender (with its relay) sends a stream of CMs to three queues; an evaluator process
(``python -m evaluator``) decides them; two receivers (own SQLite stores, own ack relays,
given the deployment secret) read two of the queues; nobody reads the third, so its CMs
must be violated at their pickup deadline. Meanwhile bad messages of every kind are
injected: poison acks (nested thousands of levels deep, over-long fields, wrong version,
forged tokens and clock-skewed times for CMs of the unread queue, which would satisfy them
if they counted) and poison copies (forged originals, signed originals with a JSON payload
nested past any decoder, unsigned and wrongly signed compensations of CMs the receivers
consumed). Time is scaled as in ``test_processes``: a "day" is two seconds.

Asserted: every CM is decided on its evidence (the scripted verdict, and the stored verdict
is ``evaluate()`` over the counted acks at its effective instant); every poison ack is
dead-lettered or recorded as an anomaly; no poison copy reaches an app, each is on the
invalid queue with a reason; ``read()`` never raised; the services still run at the end.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pika
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from ackd.receiver import Receiver
from condmsg import Destination, tables
from condmsg.core import protocol
from condmsg.core.acks import AckKind
from condmsg.core.evaluation import evaluate
from condmsg.core.timeutil import utcnow
from evaluator import store
from evaluator.store_setup import decision_store
from tests.waiting import wait_for

from .conftest import SECRET, Procs

pytestmark = [pytest.mark.slow, pytest.mark.rabbitmq, pytest.mark.postgres]

DAY = timedelta(seconds=2)
#: CMs sent per queue, one round of each every PACE_S.
ROUNDS = 12
PACE_S = 0.25


@dataclass
class Reader:
    """A receiver thread: reads ``queue`` until stopped, records what the app got."""

    receiver: Receiver
    queue: str
    transactional: bool
    got: list[Any] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> Reader:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                if self.transactional:
                    with self.receiver.transaction() as tx:
                        message = tx.read(self.queue, timeout=0.2)
                else:
                    message = self.receiver.read(self.queue, timeout=0.2)
            except Exception as exc:  # the property: read() never raises
                self.errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                continue
            if message is not None:
                self.got.append(message)


def _reader(procs: Procs, tmp_path: Path, name: str, transactional: bool) -> Reader:
    receiver = Receiver(
        amqp_url=procs.amqp_url,
        db_url=f"sqlite:///{tmp_path / (name + '.db')}",
        recipient=name,
        secret=SECRET,
        invalid_queue=f"{procs.unique_name}.invalid",
        create_schema=True,
    )
    queue = f"{procs.unique_name}.{name}"
    receiver._broker.ensure_queue(queue)
    return Reader(receiver, queue, transactional)


def _ack(cm_id: str, queue: str, **overrides: Any) -> dict[str, Any]:
    doc = {
        "v": 1,
        "ack_id": uuid.uuid4().hex,
        "cm_id": cm_id,
        "destination": queue,
        "recipient": None,
        "receiver": "poison",
        "kind": "read",
        "read_at": protocol.format_instant(utcnow()),
        "committed_at": None,
        "token": protocol.copy_token(SECRET, cm_id, queue, None),
    }
    return doc | overrides


def _poison_acks(cm_id: str, unread_queue: str, sent_at: datetime) -> list[bytes]:
    """Bad acks for a CM of the unread queue: any one of them counted would satisfy it."""
    deep = '{"v":1,"ack_id":' + "[" * 50_000 + "]" * 50_000 + "}"
    return [
        json.dumps(_ack(cm_id, unread_queue, token="0" * 64)).encode(),  # forged
        json.dumps(
            _ack(cm_id, unread_queue, read_at=protocol.format_instant(sent_at - timedelta(hours=1)))
        ).encode(),  # clock-skewed: read an hour before it was sent
        json.dumps(
            _ack(
                cm_id,
                unread_queue,
                read_at=protocol.format_instant(utcnow() + timedelta(minutes=5)),
            )
        ).encode(),  # clock-skewed: read in the future
        json.dumps(_ack(cm_id, unread_queue, v=True)).encode(),
        json.dumps(_ack(cm_id, unread_queue, v=2)).encode(),
        json.dumps(_ack(cm_id, unread_queue, receiver="r" * 300)).encode(),
        json.dumps(_ack(cm_id, unread_queue, ack_id="a" * 65)).encode(),
        deep.encode(),
        b"[" * 100_000,
        b"\xff\xfe not json",
    ]


@dataclass
class PoisonCopy:
    message_id: str
    queue: str
    headers: dict[str, Any]
    body: bytes
    content_type: str | None


def _headers(kind: str, cm_id: str, queue: str, token: str | None) -> dict[str, Any]:
    headers: dict[str, Any] = {
        protocol.H_VERSION: protocol.PROTOCOL_VERSION,
        protocol.H_KIND: kind,
        protocol.H_CM_ID: cm_id,
        protocol.H_DESTINATION: queue,
        protocol.H_SENDER: "mallory",
        protocol.H_SENT_AT: protocol.format_instant(utcnow()),
    }
    if token is not None:
        headers[protocol.H_TOKEN] = token
    return headers


def _poison_copies(queue: str, consumed_cm: str | None) -> list[PoisonCopy]:
    """Bad messages for a receiver's queue; ``consumed_cm`` one its app already has."""
    fresh = str(uuid.uuid4())
    deep = ("[" * 50_000 + "]" * 50_000).encode()
    copies = [
        ("original", fresh, "ab" * 32, b"forged copy", None),
        (
            "original",
            fresh,
            protocol.copy_token(SECRET, fresh, queue, None),
            deep,
            "application/json",
        ),
        ("success", fresh, None, b"unsigned notice", None),
    ]
    if consumed_cm is not None:
        copies += [
            ("compensation", consumed_cm, None, b"undo it (unsigned)", None),
            ("compensation", consumed_cm, "cd" * 32, b"undo it (forged)", None),
        ]
    return [
        PoisonCopy(f"poison-{uuid.uuid4().hex}", queue, _headers(kind, cm, queue, token), body, ct)
        for kind, cm, token, body, ct in copies
    ]


def _publish_copy(channel: Any, copy: PoisonCopy) -> None:
    channel.basic_publish(
        "",
        copy.queue,
        copy.body,
        pika.BasicProperties(
            headers=copy.headers,
            content_type=copy.content_type,
            reply_to="condmsg.mallory.ack",
            message_id=copy.message_id,
        ),
    )


def _drain(channel: Any, queue: str) -> list[tuple[Any, bytes]]:
    found = []
    while True:
        method, props, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return found
        found.append((props, body))


def test_valid_cms_are_decided_on_their_evidence_while_poison_flows(
    procs: Procs, make_sender: Any, tmp_path: Path
) -> None:
    sender = make_sender(procs.pg_url, procs.sender)
    relay = sender.start_relay()
    readers = [
        _reader(procs, tmp_path, "qr1", transactional=True).start(),
        _reader(procs, tmp_path, "qr2", transactional=False).start(),
    ]
    relays = [r.receiver.start_relay() for r in readers]
    unread = f"{procs.unique_name}.qr3"
    evaluator = procs.evaluator()
    connection = pika.BlockingConnection(pika.URLParameters(procs.amqp_url))
    try:
        channel = connection.channel()
        procs.wait_ready([], consumers=1)
        expected: dict[str, str] = {}
        poison_acks: list[bytes] = []
        poison_copies: list[PoisonCopy] = []
        for _ in range(ROUNDS):
            for reader in readers:
                cm_id = sender.send(b"valid", Destination(reader.queue, pickup_within=3 * DAY))
                expected[cm_id] = "satisfied"
                consumed = next(
                    (
                        m.cm_id
                        for m in reversed(reader.got)
                        if m.kind is protocol.MessageKind.ORIGINAL
                    ),
                    None,
                )
                for copy in _poison_copies(reader.queue, consumed):
                    _publish_copy(channel, copy)
                    poison_copies.append(copy)
            cm_id = sender.send(b"valid", Destination(unread, pickup_within=DAY))
            expected[cm_id] = "violated"
            with sender.engine.connect() as conn:
                sent_at = conn.execute(
                    sa.select(tables.cms.c.sent_at).where(tables.cms.c.cm_id == cm_id)
                ).scalar_one()
            for body in _poison_acks(cm_id, unread, sent_at):
                channel.basic_publish("", protocol.ack_queue(procs.sender), body)
                poison_acks.append(body)
            time.sleep(PACE_S)  # pacing the stream, not waiting for anything

        def states() -> dict[str, str]:
            with sender.engine.connect() as conn:
                return dict(conn.execute(sa.select(tables.cms.c.cm_id, tables.cms.c.state)).all())

        wait_for(lambda: "pending" not in states().values(), timeout=40)
        # Every CM decided on its evidence: the scripted verdict...
        decided = states()
        against = {c: (decided[c], v) for c, v in expected.items() if decided[c] != v}
        assert not against, (
            f"{len(against)} CMs decided against their evidence: {against}; "
            f"receivers' read() errors: {[r.errors[:3] for r in readers]}; "
            f"evaluator running: {evaluator.poll() is None}"
        )
        # ... and the stored verdict is evaluate() over the acks that counted.
        with Session(sender.engine) as session:
            rows = list(session.execute(sa.select(tables.cms)))
            counted = decision_store(session).counted_acks(session, [r.cm_id for r in rows])
        for row in rows:
            cm = store.CmRow.of(row)
            assert cm.effective_at is not None
            result = evaluate(cm.condition, cm.sent_at, counted.get(cm.cm_id, ()), cm.effective_at)
            assert result.verdict.value == cm.state, (cm.cm_id, result, cm.state)
            assert all(a.kind in (AckKind.READ, AckKind.COMMIT) for a in counted.get(cm.cm_id, ()))

        # Every poison ack dead-lettered with a reason, or recorded as an anomaly.
        dead: list[tuple[Any, bytes]] = []

        def accounted() -> list[bytes]:
            dead.extend(_drain(channel, protocol.dead_letter_queue(procs.sender)))
            with sender.engine.connect() as conn:
                anomalies = set(conn.execute(sa.select(tables.anomalies.c.ack_id)).scalars())
            bodies = [body for _, body in dead]
            return [b for b in poison_acks if b not in bodies and _ack_id_of(b) not in anomalies]

        missing: list[bytes] = []
        deadline = time.monotonic() + 20
        while (missing := accounted()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not missing, [m[:200] for m in missing]
        assert all((props.headers or {}).get(protocol.H_REASON) for props, _ in dead)

        # No poison copy reached an app; each is on the invalid queue with a reason.
        invalid: dict[str, Any] = {}

        def all_invalid() -> bool:
            for props, _ in _drain(channel, f"{procs.unique_name}.invalid"):
                invalid[props.message_id] = props
            return all(c.message_id in invalid for c in poison_copies)

        wait_for(all_invalid, timeout=20)
        assert all(props.headers.get(protocol.H_REASON) for props in invalid.values())
        poison_ids = {c.message_id for c in poison_copies}
        for reader in readers:
            assert not reader.errors, reader.errors
            leaked = [(m.kind, m.message_id) for m in reader.got if m.message_id in poison_ids]
            assert not leaked, f"the app on {reader.queue} got poison: {leaked}"
            kinds = {m.kind for m in reader.got}
            assert kinds == {protocol.MessageKind.ORIGINAL}, kinds  # every CM satisfied: no notices
        # The services still run.
        assert evaluator.poll() is None, "the evaluator process exited"
        assert all(r.thread is not None and r.thread.is_alive() for r in readers)
    finally:
        connection.close()
        for reader in readers:
            reader.stop.set()
        for reader in readers:
            if reader.thread is not None:
                reader.thread.join(10)
        for r in relays:
            r.stop()
        relay.stop()
        for reader in readers:
            reader.receiver.close()
            reader.receiver.engine.dispose()
    codes = procs.stop_all()
    assert set(codes.values()) == {0}, codes


def _ack_id_of(body: bytes) -> object:
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return doc.get("ack_id") if isinstance(doc, dict) else None
