"""The receiver against bad input: a message it cannot take never reaches the app nor
stops a read (it goes to the invalid queue with a reason), and a failure of its own
database is never blamed on the message."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pika
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from ackd import rlog, sequences, validation
from ackd.broker import Delivery
from condmsg import Destination
from condmsg.core import protocol
from condmsg.core.errors import BrokerError
from condmsg.core.protocol import MessageKind
from condmsg.runtime.topology import declare_service_queue
from condmsg.sending.copies import plan_copies
from tests.integration.condmsg_helpers import (
    SECRET,
    get_all,
    invalid_reasons,
    publish_original,
    receiver_queue,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


#: Nested deeper than any recursion limit of ``json.loads``.
DEEP_JSON = b"[" * 200_000 + b"]" * 200_000


def test_a_deeply_nested_json_payload_goes_to_the_invalid_queue_and_reading_goes_on(
    db_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    receiver = make_receiver(db_url)
    queue = receiver_queue(receiver, unique_name)
    publish_original(channel, queue, body=DEEP_JSON, content_type="application/json")
    channel.basic_publish(
        "", queue, DEEP_JSON, pika.BasicProperties(content_type="application/json")
    )
    good = publish_original(channel, queue, body=b'{"ok": true}', content_type="application/json")

    message = wait_for(lambda: receiver.read(queue, timeout=0.5))
    assert (message.cm_id, message.payload) == (good, {"ok": True})
    assert receiver.read(queue, timeout=0.3) is None
    reasons = invalid_reasons(channel, receiver)
    assert len(reasons) == 2
    assert all(reasons), reasons
    assert receiver.stats.invalid == 2


def test_a_deeply_nested_reassembled_sequence_goes_to_the_invalid_queue(
    db_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    receiver = make_receiver(db_url)
    queue = receiver_queue(receiver, unique_name)
    publish_original(
        channel, queue, body=DEEP_JSON, content_type="application/json", part_bytes=150_000
    )
    good = publish_original(channel, queue)

    with receiver.transaction() as tx:
        message = wait_for(lambda: tx.read(queue, timeout=0.5))
        assert message.cm_id == good
    with receiver.transaction() as tx:
        assert tx.read(queue, timeout=0.5) is None
    moved = get_all(channel, receiver.invalid_queue)
    assert [body for _, body in moved] == [DEEP_JSON]
    assert moved[0][0].headers[protocol.H_REASON]
    assert receiver.stats.invalid == 1


def test_any_exception_while_judging_a_message_dead_letters_it_alone(
    db_url: str,
    unique_name: str,
    make_receiver: Any,
    channel: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The last resort: a codec bug (here a KeyError out of the payload check) costs the
    message it happened on, never the reader or the consume loop."""
    receiver = make_receiver(db_url)
    queue = receiver_queue(receiver, unique_name)
    real_check = validation.check_payload

    def buggy_check(body: bytes, content_type: str | None) -> None:
        if body == b"trigger":
            raise KeyError("codec bug")
        real_check(body, content_type)

    monkeypatch.setattr(validation, "check_payload", buggy_check)
    publish_original(channel, queue, body=b"trigger")
    good = publish_original(channel, queue)
    seen: list[str] = []

    def handler(message: Any, session: Session | None) -> None:
        seen.append(message.cm_id)

    assert receiver.consume(queue, handler, max_messages=1, idle_timeout_s=5) == 1
    assert seen == [good]
    assert invalid_reasons(channel, receiver) == ["undecodable: KeyError: 'codec bug'"]


def test_a_database_failure_is_not_the_messages_fault(
    pg_url: str,
    unique_name: str,
    make_receiver: Any,
    channel: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failing receiver store propagates to the caller; the message is given back to the
    queue (never dead-lettered) and read once the store works again."""
    receiver = make_receiver(pg_url)
    queue = receiver_queue(receiver, unique_name)
    cm_id = publish_original(channel, queue)
    real_claim = rlog.claim_original

    def failing_claim(*args: Any, **kwargs: Any) -> bool:
        raise sa.exc.OperationalError("INSERT", {}, Exception("server closed the connection"))

    monkeypatch.setattr(rlog, "claim_original", failing_claim)
    with pytest.raises(sa.exc.OperationalError), receiver.transaction() as tx:
        wait_for(lambda: tx.read(queue, timeout=0.5))
    monkeypatch.setattr(rlog, "claim_original", real_claim)
    with receiver.transaction() as tx:
        message = wait_for(lambda: tx.read(queue, timeout=0.5), timeout=15)
        assert message.cm_id == cm_id
    assert get_all(channel, receiver.invalid_queue, settle_s=0.1) == []


def test_a_stored_sequence_with_a_forged_token_is_refused_by_a_receiver_with_the_secret(
    db_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    """Parts stored by a receiver without the secret (or before it had one) are judged
    again when assembled: the sequence must carry a verifying copy token."""
    receiver = make_receiver(db_url, secret=SECRET)
    queue = receiver_queue(receiver, unique_name)
    cm_id = str(uuid.uuid4())
    (plan,) = plan_copies(
        cm_id=cm_id,
        condition=Destination(queue, pickup_within=timedelta(seconds=30)),
        sender="s",
        sent_at=datetime.now(UTC),
        secret=b"not the deployment secret",
        body=b"x" * 300,
        content_type="application/octet-stream",
        app_headers={},
        part_bytes=100,
    )
    assert len(plan.messages) == 3
    with Session(receiver.engine) as session, session.begin():
        for position, message in enumerate(plan.messages):
            properties = pika.BasicProperties(
                message_id=message.message_id,
                reply_to=message.reply_to,
                content_type=message.content_type,
                headers=dict(message.headers or {}),
            )
            delivery = Delivery(queue, position + 1, False, properties, message.body)
            row = sequences.part_row(
                delivery, seq_id=plan.message_id, position=position, size=3, now=datetime.now(UTC)
            )
            receiver.store.store_part(session, row)

    assert receiver.read(queue, timeout=1.0) is None
    moved = get_all(channel, receiver.invalid_queue)
    assert [body for _, body in moved] == [b"x" * 300]
    assert "token" in moved[0][0].headers[protocol.H_REASON]
    assert receiver.stats.invalid == 1


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
    queue = receiver_queue(receiver, unique_name)
    channel.basic_publish(
        "",
        queue,
        body,
        pika.BasicProperties(
            headers=headers, content_type=content_type, reply_to="acks", message_id="m1"
        ),
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
    queue = receiver_queue(receiver, unique_name)
    forged = _condmsg_headers(**{protocol.H_DESTINATION: queue, protocol.H_TOKEN: "ab" * 32})
    channel.basic_publish(
        "", queue, b"x", pika.BasicProperties(headers=forged, reply_to="a", message_id="m1")
    )
    publish_original(channel, queue, body=b"genuine")
    message = wait_for(lambda: receiver.read(queue, timeout=0.5))
    assert message.kind is MessageKind.ORIGINAL
    assert message.payload == b"genuine"
    moved = get_all(channel, receiver.invalid_queue)
    assert [props.headers[protocol.H_REASON] for props, _ in moved] == [
        "bad token: the copy's HMAC does not verify"
    ]


@pytest.mark.postgres
def test_what_postgresql_could_not_store_is_invalid(
    pg_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    """A NUL (no PostgreSQL text holds one) or a value longer than its column, in a
    condmsg header, ``reply_to`` or the message id: the copy goes to the invalid queue
    with the reason, instead of failing the receiver's store each time it is read."""
    receiver = make_receiver(pg_url)
    queue = receiver_queue(receiver, unique_name)
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


@pytest.mark.parametrize("transactional", [False, True], ids=["read", "transaction"])
def test_a_message_whose_copy_to_the_invalid_queue_fails_goes_back_to_its_queue(
    pg_url: str, unique_name: str, make_receiver: Any, channel: Any, transactional: bool
) -> None:
    """The broker refuses the invalid queue (declared meanwhile with other arguments than
    the receiver's, so that its declaration on the copying channel fails with
    PRECONDITION_FAILED): the read raises a BrokerError naming the invalid queue, the
    malformed message is not lost but given back to its queue, and once the invalid queue
    is usable again the next read moves it there."""
    receiver = make_receiver(pg_url)
    queue = receiver_queue(receiver, unique_name)  # the receiver has declared its queues
    channel.queue_delete(receiver.invalid_queue)
    channel.queue_declare(receiver.invalid_queue, durable=False)
    bad = _condmsg_headers(**{protocol.H_KIND: "gossip", protocol.H_DESTINATION: queue})
    channel.basic_publish("", queue, b"x", pika.BasicProperties(headers=bad, reply_to="acks"))

    refused = f"to the invalid-message queue '{receiver.invalid_queue}' failed: .*PRECONDITION"
    if transactional:
        with pytest.raises(BrokerError, match=refused), receiver.transaction() as tx:
            tx.read(queue, timeout=5)
    else:
        with pytest.raises(BrokerError, match=refused):
            receiver.read(queue, timeout=5)
    # Counted, not read: a channel that read from the classic queue would crash (on
    # RabbitMQ's side) reading from the quorum queue of the same name that replaces it.
    refusing = channel.queue_declare(receiver.invalid_queue, passive=True)
    assert refusing.method.message_count == 0
    assert receiver.stats.invalid == 0

    channel.queue_delete(receiver.invalid_queue)
    declare_service_queue(channel, receiver.invalid_queue)
    moved = wait_for(
        lambda: receiver.read(queue, timeout=0.3) or get_all(channel, receiver.invalid_queue),
        timeout=15,
    )
    assert [(body, props.headers["condmsg-original-queue"]) for props, body in moved] == [
        (b"x", queue)
    ]
    assert "unknown condmsg-kind" in moved[0][0].headers[protocol.H_REASON]
    assert receiver.stats.invalid == 1
    assert get_all(channel, queue, settle_s=0.1) == []


def test_an_invalid_queue_deleted_while_the_receiver_runs_loses_nothing(
    pg_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    """The invalid queue is deleted after the receiver has used it: the broker returns the
    next copy (it is published ``mandatory``) instead of confirming it into nothing, the
    read raises a BrokerError and the message goes back to its queue; the next read
    declares the invalid queue again and moves the message there."""
    receiver = make_receiver(pg_url)
    queue = receiver_queue(receiver, unique_name)
    bad = _condmsg_headers(**{protocol.H_KIND: "gossip", protocol.H_DESTINATION: queue})
    channel.basic_publish("", queue, b"first", pika.BasicProperties(headers=bad, reply_to="a"))
    assert receiver.read(queue, timeout=5) is None  # moved: the copying channel is open
    assert [body for _props, body in get_all(channel, receiver.invalid_queue)] == [b"first"]

    channel.queue_delete(receiver.invalid_queue)
    channel.basic_publish("", queue, b"second", pika.BasicProperties(headers=bad, reply_to="a"))
    with pytest.raises(BrokerError, match=r"to the invalid-message queue .* failed"):
        receiver.read(queue, timeout=5)
    assert receiver.stats.invalid == 1

    moved = wait_for(
        lambda: receiver.read(queue, timeout=0.3) or get_all(channel, receiver.invalid_queue),
        timeout=15,
    )
    assert [body for _props, body in moved] == [b"second"]
    assert "unknown condmsg-kind" in moved[0][0].headers[protocol.H_REASON]
    assert receiver.stats.invalid == 2
    assert get_all(channel, queue, settle_s=0.1) == []
