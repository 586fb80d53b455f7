"""Sender transactions, payload types, Message Sequences and bad input at the receiver."""

from __future__ import annotations

import os
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pika
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import outbox
from condmsg import ConditionError, Destination, DestinationSet, evaluate, protocol, sender_tables
from condmsg.protocol import MessageKind
from condmsg.sender import Outgoing

from .condmsg_helpers import SECRET, get_all, publish_copy, wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


def _name(unique_name: str) -> str:
    return unique_name.replace(".", "-")


def _relay(endpoint: Any) -> None:
    with endpoint.relay() as relay:
        relay.drain(10)


def test_a_sender_transaction_that_rolls_back_sends_nothing(
    pg_url: str, unique_name: str, make_sender: Any, channel: Any
) -> None:
    sender = make_sender(pg_url, _name(unique_name))
    queue = f"{unique_name}.q"
    with Session(sender.engine) as session:
        session.begin()
        sender.send(b"x", Destination(queue, pickup_within=timedelta(seconds=9)), session=session)
        session.rollback()
    _relay(sender)
    assert get_all(channel, queue, settle_s=0.2) == []
    with sender.engine.connect() as conn:
        assert (
            conn.execute(sa.select(sa.func.count()).select_from(sender_tables.cms)).scalar_one()
            == 0
        )

    with Session(sender.engine) as session, session.begin():
        cm_id = sender.send(
            b"y", Destination(queue, pickup_within=timedelta(seconds=9)), session=session
        )
    _relay(sender)
    arrived = get_all(channel, queue)
    assert [props.correlation_id for props, _ in arrived] == [cm_id]


def test_send_records_cm_copies_and_compensations_and_fans_out(
    db_url: str, unique_name: str, make_sender: Any, make_receiver: Any, channel: Any
) -> None:
    name = _name(unique_name)
    sender = make_sender(db_url, name)
    queues = [f"{unique_name}.q{i}" for i in range(3)]
    condition = DestinationSet(
        *(Destination(q) for q in queues),
        pickup_within=timedelta(seconds=30),
        min_pickup=2,
        priority=4,
    )
    cm_id = sender.send({"meeting": "Tuesday"}, condition, compensation="meeting cancelled")
    with sender.engine.connect() as conn:
        cm = conn.execute(sa.select(sender_tables.cms)).one()
        copies = conn.execute(
            sa.select(sender_tables.copies).order_by(sender_tables.copies.c.destination)
        ).all()
        comps = conn.execute(sa.select(sender_tables.compensations)).all()
    assert (cm.cm_id, cm.state, cm.sender) == (cm_id, "pending", name)
    assert cm.evaluation_deadline - cm.sent_at == timedelta(seconds=30)
    assert [c.destination for c in copies] == queues
    assert {c.body for c in comps} == {b"meeting cancelled"}
    _relay(sender)
    receiver = make_receiver(db_url)
    for queue in queues:
        message = receiver.read(queue, timeout=5)
        assert message is not None
        assert message.payload == {"meeting": "Tuesday"}
        assert message.headers[protocol.H_REQUIRES] == "pickup"
        assert protocol.verify_token(SECRET, message.headers[protocol.H_TOKEN], cm_id, queue, None)


@pytest.mark.parametrize(
    ("payload", "expected"),
    [(b"\x00\x01", b"\x00\x01"), ("grüße", "grüße"), ([1, {"a": None}], [1, {"a": None}])],
)
def test_payload_types_round_trip(
    sqlite_url: str,
    unique_name: str,
    make_sender: Any,
    make_receiver: Any,
    payload: Any,
    expected: Any,
) -> None:
    sender = make_sender(sqlite_url, _name(unique_name))
    queue = f"{unique_name}.q"
    sender.send(payload, Destination(queue, pickup_within=timedelta(seconds=30)))
    _relay(sender)
    message = make_receiver(sqlite_url).read(queue, timeout=5)
    assert message is not None
    assert message.payload == expected


def test_send_rejects_bad_conditions_and_reserved_headers(
    sqlite_url: str, unique_name: str, make_sender: Any
) -> None:
    sender = make_sender(sqlite_url, _name(unique_name))
    with pytest.raises(ConditionError, match="no pickup_within or process_within"):
        sender.send(b"x", Destination("q"))
    with pytest.raises(ConditionError, match="must be a Destination or DestinationSet"):
        sender.send(b"x", "q")  # type: ignore[arg-type]
    with pytest.raises(protocol.ProtocolError, match="condmsg- prefix is reserved"):
        sender.send(
            b"x",
            Destination("q", pickup_within=timedelta(seconds=1)),
            headers={"condmsg-kind": "x"},
        )
    with pytest.raises(protocol.ProtocolError, match="JSON-serialisable"):
        sender.send(object(), Destination("q", pickup_within=timedelta(seconds=1)))
    with sender.engine.connect() as conn:
        assert (
            conn.execute(sa.select(sa.func.count()).select_from(sender_tables.cms)).scalar_one()
            == 0
        )


def test_a_10_mib_payload_round_trips_as_a_sequence_through_two_competing_consumers(
    pg_url: str, unique_name: str, make_sender: Any, make_receiver: Any, channel: Any
) -> None:
    name = _name(unique_name)
    sender = make_sender(pg_url, name)
    queue = f"{unique_name}.q"
    payload = os.urandom(10 * 1024 * 1024)
    cm_id = sender.send(payload, Destination(queue, process_within=timedelta(seconds=60)))
    with sender.engine.connect() as conn:
        assert conn.execute(sa.select(sender_tables.copies.c.parts)).scalar_one() == 10
    consumers = [make_receiver(pg_url, f"worker-{i}", poll_interval_s=0.01) for i in (1, 2)]
    for consumer in consumers:
        consumer._broker.ensure_queue(queue)
    got: list[Any] = []
    stop = threading.Event()

    def work(receiver: Any) -> None:
        while not stop.is_set():
            with receiver.transaction() as tx:
                message = tx.read(queue, timeout=0.2)
                if message is not None:
                    got.append(message)

    threads = [threading.Thread(target=work, args=(c,), daemon=True) for c in consumers]
    for thread in threads:
        thread.start()
    _relay(sender)
    wait_for(lambda: got, timeout=60)
    stop.set()
    for thread in threads:
        thread.join(10)
    assert len(got) == 1
    assert (got[0].cm_id, got[0].payload) == (cm_id, payload)
    assert sum(c.stats.parts for c in consumers) == 10
    assert all(c.stats.parts > 0 for c in consumers), [c.stats.parts for c in consumers]
    for consumer in consumers:
        _relay(consumer)
    acks = [
        protocol.AckMessage.from_json(body)
        for _, body in get_all(channel, protocol.ack_queue(name))
    ]
    assert [(a.cm_id, a.kind.value) for a in acks] == [(cm_id, "commit")]


def test_an_incomplete_sequence_goes_to_the_invalid_queue_after_the_timeout(
    sqlite_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    receiver = make_receiver(sqlite_url, sequence_timeout=timedelta(seconds=1))
    queue = f"{unique_name}.q"
    receiver._broker.ensure_queue(queue)
    publish_copy(
        channel,
        cm_id=str(uuid.uuid4()),
        condition=Destination(queue, pickup_within=timedelta(seconds=30)),
        sender="s",
        sent_at=datetime.now(UTC),
        body=b"a" * 30,
        part_bytes=10,
    )
    # Only parts 0 and 1 of 3 arrive: drop part 2 from the queue first.
    arrived = get_all(channel, queue)
    assert len(arrived) == 3
    for props, body in arrived:
        if props.headers[protocol.H_SEQ_POS] != 2:
            channel.basic_publish(
                "", queue, body, pika.BasicProperties(headers=props.headers, reply_to="r")
            )
    assert receiver.read(queue, timeout=0.5) is None
    assert receiver.stats.parts == 2
    moved = wait_for(
        lambda: receiver.read(queue, timeout=0.3) or get_all(channel, receiver.invalid_queue),
        timeout=15,
    )
    assert len(moved) == 2
    assert all("incomplete sequence" in props.headers[protocol.H_REASON] for props, _ in moved)


def _condmsg_headers(**overrides: Any) -> dict[str, Any]:
    headers: dict[str, Any] = {
        protocol.H_VERSION: protocol.PROTOCOL_VERSION,
        protocol.H_KIND: "original",
        protocol.H_CM_ID: str(uuid.uuid4()),
        protocol.H_DESTINATION: "d",
        protocol.H_SENDER: "s",
        protocol.H_SENT_AT: "2026-11-21T10:00:00.000000Z",
        protocol.H_TOKEN: "0" * 64,
    }
    headers.update(overrides)
    return {k: v for k, v in headers.items() if v is not None}


@pytest.mark.parametrize(
    ("headers", "content_type", "body", "reason"),
    [
        (_condmsg_headers(**{protocol.H_KIND: None}), None, b"x", "missing header condmsg-kind"),
        (_condmsg_headers(**{protocol.H_KIND: "gossip"}), None, b"x", "unknown condmsg-kind"),
        (_condmsg_headers(**{protocol.H_SENT_AT: "yesterday"}), None, b"x", "not an ISO-8601"),
        (_condmsg_headers(**{protocol.H_TOKEN: "forged"}), None, b"x", "64-digit hex"),
        (_condmsg_headers(**{protocol.H_VERSION: 99}), None, b"x", "unsupported condmsg-version"),
        (
            _condmsg_headers(**{protocol.H_CM_ID: "cm\x00"}),
            None,
            b"x",
            "condmsg-cm-id contains a NUL",
        ),
        (
            _condmsg_headers(
                **{protocol.H_SEQ_ID: "s\x00", protocol.H_SEQ_POS: 0, protocol.H_SEQ_SIZE: 2}
            ),
            None,
            b"x",
            "contains a NUL",
        ),
        (_condmsg_headers(), "application/json", b"{not json", "does not decode"),
        (
            _condmsg_headers(
                **{protocol.H_SEQ_ID: "s1", protocol.H_SEQ_POS: 5, protocol.H_SEQ_SIZE: 3}
            ),
            None,
            b"x",
            "sequence position 5 of size 3",
        ),
    ],
)
def test_malformed_messages_go_to_the_invalid_queue_with_the_reason(
    sqlite_url: str,
    unique_name: str,
    make_receiver: Any,
    channel: Any,
    headers: dict[str, Any],
    content_type: str | None,
    body: bytes,
    reason: str,
) -> None:
    receiver = make_receiver(sqlite_url)
    queue = f"{unique_name}.q"
    receiver._broker.ensure_queue(queue)
    channel.basic_publish(
        "",
        queue,
        body,
        pika.BasicProperties(headers=headers, content_type=content_type, reply_to="acks"),
    )
    channel.basic_publish("", queue, b"fine")  # the receiver keeps going after it
    message = wait_for(lambda: receiver.read(queue, timeout=0.5))
    assert message.payload == b"fine"
    moved = get_all(channel, receiver.invalid_queue)
    assert len(moved) == 1
    props, moved_body = moved[0]
    assert moved_body == body
    assert reason in props.headers[protocol.H_REASON]
    assert props.headers["condmsg-original-queue"] == queue
    assert receiver.stats.invalid == 1


def test_a_receiver_with_the_secret_rejects_a_forged_copy(
    sqlite_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    receiver = make_receiver(sqlite_url, secret=SECRET)
    queue = f"{unique_name}.q"
    receiver._broker.ensure_queue(queue)
    forged = _condmsg_headers(**{protocol.H_DESTINATION: queue, protocol.H_TOKEN: "ab" * 32})
    channel.basic_publish("", queue, b"x", pika.BasicProperties(headers=forged, reply_to="a"))
    publish_copy(
        channel,
        cm_id=str(uuid.uuid4()),
        condition=Destination(queue, pickup_within=timedelta(seconds=30)),
        sender="s",
        sent_at=datetime.now(UTC),
        body=b"genuine",
    )
    message = wait_for(lambda: receiver.read(queue, timeout=0.5))
    assert message.kind is MessageKind.ORIGINAL
    assert message.payload == b"genuine"
    moved = get_all(channel, receiver.invalid_queue)
    assert [props.headers[protocol.H_REASON] for props, _ in moved] == [
        "bad token: the copy's HMAC does not verify"
    ]


def test_send_many_records_every_cm_in_one_transaction_and_fans_each_out(
    db_url: str, unique_name: str, make_sender: Any, channel: Any
) -> None:
    sender = make_sender(db_url, _name(unique_name))
    one, two = f"{unique_name}.q0", f"{unique_name}.q1"
    pair = DestinationSet(Destination(one), Destination(two), pickup_within=timedelta(seconds=9))
    cm_ids = sender.send_many(
        [
            Outgoing(payload=b"a", condition=Destination(one, pickup_within=timedelta(seconds=5))),
            Outgoing(payload={"n": 2}, condition=pair, compensation=b"undo 2", headers={"x": 1}),
            Outgoing(payload="c", condition=pair, notify_success=True),
        ]
    )
    assert len(set(cm_ids)) == 3
    with sender.engine.connect() as conn:
        cms = {r.cm_id: r for r in conn.execute(sa.select(sender_tables.cms))}
        copies = conn.execute(
            sa.select(sender_tables.copies.c.cm_id, sender_tables.copies.c.destination)
        ).all()
        comps = {
            (r.cm_id, r.destination): r
            for r in conn.execute(sa.select(sender_tables.compensations))
        }
    assert set(cms) == set(cm_ids)
    assert [cms[c].notify_success for c in cm_ids] == [False, False, True]
    # The first check of a CM with no ack yet is exactly what evaluate says at sent_at.
    for cm_id, condition in zip(
        cm_ids, [Destination(one, pickup_within=timedelta(seconds=5)), pair, pair], strict=True
    ):
        sent_at = cms[cm_id].sent_at.replace(tzinfo=UTC)  # SQLite hands back naive UTC
        expected = evaluate(condition, sent_at, (), sent_at).next_check_at
        assert cms[cm_id].next_check_at.replace(tzinfo=UTC) == expected
    assert sorted(copies) == sorted(
        [(cm_ids[0], one), (cm_ids[1], one), (cm_ids[1], two), (cm_ids[2], one), (cm_ids[2], two)]
    )
    assert comps[(cm_ids[1], two)].body == b"undo 2"
    assert comps[(cm_ids[2], one)].system_generated
    _relay(sender)
    at_one = get_all(channel, one)
    at_two = get_all(channel, two)
    assert [props.correlation_id for props, _ in at_one] == cm_ids  # in send order
    assert [props.correlation_id for props, _ in at_two] == cm_ids[1:]
    assert at_one[1][0].headers["x"] == 1


def test_send_many_is_all_or_nothing(sqlite_url: str, unique_name: str, make_sender: Any) -> None:
    sender = make_sender(sqlite_url, _name(unique_name))
    good = Outgoing(payload=b"ok", condition=Destination("q", pickup_within=timedelta(seconds=1)))
    bad = Outgoing(payload=b"no", condition=Destination("q"))  # no deadline: invalid
    with pytest.raises(ConditionError, match="no pickup_within or process_within"):
        sender.send_many([good, bad])
    assert sender.send_many([]) == []
    with sender.engine.connect() as conn:
        assert (
            conn.execute(sa.select(sa.func.count()).select_from(sender_tables.cms)).scalar_one()
            == 0
        )
        assert conn.execute(sa.text("SELECT count(*) FROM condmsg_outbox")).scalar_one() == 0


def test_a_cm_is_one_outbox_row_and_each_copy_keeps_its_id_token_and_headers(
    db_url: str, unique_name: str, make_sender: Any, channel: Any
) -> None:
    sender = make_sender(db_url, _name(unique_name))
    queues = [f"{unique_name}.q{i}" for i in range(3)]
    condition = DestinationSet(
        Destination(queues[0], recipient="ann"),
        Destination(queues[1], process_within=timedelta(seconds=9)),
        Destination(queues[2], priority=4),
        pickup_within=timedelta(seconds=9),
    )
    cm_ids = sender.send_many([Outgoing(payload=b"p", condition=condition)] * 2)
    with sender.engine.connect() as conn:
        rows = conn.execute(sa.select(outbox.outbox_table().c.copies)).scalars().all()
        ids = {
            (r.cm_id, r.destination): r.message_id
            for r in conn.execute(sa.select(sender_tables.copies))
        }
    assert [len(copies) for copies in rows] == [3, 3]  # one row per CM, not per copy
    _relay(sender)
    for queue in queues:
        got = get_all(channel, queue)
        assert [props.correlation_id for props, _ in got] == cm_ids
        for props, body in got:
            h = props.headers
            assert (
                body == b"p"
                and h[protocol.H_DESTINATION] == queue
                and h[protocol.H_CM_ID] == props.correlation_id
            )
            assert props.message_id == ids[(props.correlation_id, queue)]
            recipient = "ann" if queue == queues[0] else None
            assert h.get(protocol.H_RECIPIENT) == recipient
            assert h[protocol.H_TOKEN] == protocol.copy_token(
                SECRET, props.correlation_id, queue, recipient
            )
            assert h[protocol.H_REQUIRES] == ("process" if queue == queues[1] else "pickup")
            assert props.priority == (4 if queue == queues[2] else 0)


@pytest.mark.postgres
def test_what_postgresql_could_not_store_is_invalid(
    pg_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    """A NUL (no PostgreSQL text holds one) or a value longer than its column, in a
    condmsg header, ``reply_to`` or the message id: the copy goes to the invalid queue
    with the reason, instead of failing the receiver's store each time it is read."""
    receiver = make_receiver(pg_url)
    queue = f"{unique_name}.q"
    receiver._broker.ensure_queue(queue)
    copy = _condmsg_headers(**{protocol.H_DESTINATION: queue})
    for headers, reply_to, message_id in (
        (
            _condmsg_headers(**{protocol.H_CM_ID: "cm\x00", protocol.H_DESTINATION: queue}),
            "acks",
            None,
        ),
        (
            _condmsg_headers(**{protocol.H_CM_ID: "c" * 37, protocol.H_DESTINATION: queue}),
            "acks",
            None,
        ),
        (copy, "acks\x00", None),
        (copy, "acks", "m\x00"),
        (copy, "acks", "m" * 65),
    ):
        props = pika.BasicProperties(headers=headers, reply_to=reply_to, message_id=message_id)
        channel.basic_publish("", queue, b"x", props)
    # A plain message's id is only a key of the redelivery counts: any id passes.
    channel.basic_publish("", queue, b"fine", pika.BasicProperties(message_id="m\x00" * 100))
    message = wait_for(lambda: receiver.read(queue, timeout=0.5))
    assert message.payload == b"fine"
    moved = get_all(channel, receiver.invalid_queue)
    assert sorted(props.headers[protocol.H_REASON] for props, _ in moved) == [
        "header condmsg-cm-id contains a NUL character",
        "header condmsg-cm-id is longer than 36 characters",
        "message_id contains a NUL character",
        "message_id is longer than 64 characters",
        "reply_to contains a NUL character",
    ]
