"""What ``Sender.send`` and ``send_many`` record and fan out: a CM, its copies and
compensations in the caller's transaction (nothing if it rolls back), one outbox row per
CM; every payload type round-trips; bad conditions and reserved headers are refused."""

from __future__ import annotations

from datetime import UTC, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import outbox
from condmsg import ConditionError, Destination, DestinationSet, evaluate, tables
from condmsg.core import protocol
from condmsg.sending.sender import Outgoing
from tests.integration.condmsg_helpers import SECRET, get_all

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
        assert conn.execute(sa.select(sa.func.count()).select_from(tables.cms)).scalar_one() == 0

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
        cm = conn.execute(sa.select(tables.cms)).one()
        copies = conn.execute(sa.select(tables.copies).order_by(tables.copies.c.destination)).all()
        comps = conn.execute(sa.select(tables.compensations)).all()
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
        assert conn.execute(sa.select(sa.func.count()).select_from(tables.cms)).scalar_one() == 0


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
        cms = {r.cm_id: r for r in conn.execute(sa.select(tables.cms))}
        copies = conn.execute(sa.select(tables.copies.c.cm_id, tables.copies.c.destination)).all()
        comps = {(r.cm_id, r.destination): r for r in conn.execute(sa.select(tables.compensations))}
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
        assert conn.execute(sa.select(sa.func.count()).select_from(tables.cms)).scalar_one() == 0
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
            (r.cm_id, r.destination): r.message_id for r in conn.execute(sa.select(tables.copies))
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
