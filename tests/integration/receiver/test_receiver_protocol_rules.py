"""The receiver holds to docs/protocol.md on the wire and in its store: integer headers
read with their AMQP field type, the message ids it requires and the ones it does not
check, and what it writes when it moves a message it holds only in its store."""

from __future__ import annotations

import dataclasses
import json
import struct
from datetime import timedelta
from typing import Any, cast

import pika
import pika.compat
import pika.data
import pytest
import sqlalchemy as sa

from ackd.tables import sequence_parts
from condmsg.core import protocol
from outbox.message import OutboxMessage
from tests.integration.condmsg_helpers import (
    copy_messages,
    get_all,
    invalid_reasons,
    publish,
    receiver_queue,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


class _Double(float):
    """A header value the test's publisher writes as an AMQP double (``d``): pika itself
    cannot write a float, so a sender in another language is played here."""


@pytest.fixture
def doubles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let this test's pika channel encode :class:`_Double` header values."""
    pika_encode = pika.data.encode_value

    def encode_value(pieces: list[bytes], value: Any) -> int:
        if isinstance(value, _Double):
            pieces.append(struct.pack(">cd", b"d", value))
            return 9
        return pika_encode(pieces, value)

    monkeypatch.setattr(pika.data, "encode_value", encode_value)


def _with(message: OutboxMessage, *, message_id: Any = ..., **headers: Any) -> OutboxMessage:
    """``message`` with ``headers`` replaced (a None value removes the header)."""
    changed = dict(message.headers or {})
    for name, value in headers.items():
        name = name.replace("_", "-")
        if value is None:
            changed.pop(name, None)
        else:
            changed[name] = value
    if message_id is ...:
        return dataclasses.replace(message, headers=changed)
    return dataclasses.replace(message, headers=changed, message_id=message_id)


def test_integer_headers_are_read_by_their_amqp_field_type(
    pg_url: str, unique_name: str, make_receiver: Any, channel: Any, doubles: None
) -> None:
    """A 64-bit ``condmsg-version`` of 1 is an integer like any other; a double is not an
    integer even when it is integral, and ``1.5`` is never read as position 1; a reason
    shows a 64-bit integer as the number it is."""
    receiver = make_receiver(pg_url)
    queue = receiver_queue(receiver, unique_name)
    (wide,) = copy_messages(queue)
    publish(channel, _with(wide, condmsg_version=pika.compat.long(1)))
    parts = copy_messages(queue, b"x" * 30, part_bytes=10)
    publish(channel, _with(parts[1], condmsg_seq_pos=_Double(1.5)))
    publish(channel, _with(parts[2], condmsg_seq_size=_Double(3.0)))
    publish(channel, _with(parts[0], condmsg_seq_size=pika.compat.long(2**31)))
    (double_version,) = copy_messages(queue)
    publish(channel, _with(double_version, condmsg_version=_Double(1.0)))

    message = wait_for(lambda: receiver.read(queue, timeout=0.5))
    assert message.message_id == wide.message_id
    assert receiver.read(queue, timeout=0.3) is None
    moved = {
        props.headers[protocol.H_REASON]: props.headers
        for props, _ in get_all(channel, receiver.invalid_queue)
    }
    # pika cannot write a float: the invalid copy keeps it as its text.
    assert moved["header condmsg-seq-pos must be an integer, got 1.5"]["condmsg-seq-pos"] == "1.5"
    assert sorted(moved) == [
        "header condmsg-seq-pos must be an integer, got 1.5",
        "header condmsg-seq-size must be an integer, got 3.0",
        "sequence position 0 of size 2147483648 is out of range",
        "unsupported condmsg-version 1.0",
    ]


def test_a_plain_message_keeps_its_double_header_as_a_float(
    pg_url: str, unique_name: str, make_receiver: Any, channel: Any, doubles: None
) -> None:
    receiver = make_receiver(pg_url)
    queue = receiver_queue(receiver, unique_name)
    channel.basic_publish(
        "", queue, b"plain", pika.BasicProperties(headers={"price": cast(Any, _Double(2.75))})
    )
    message = wait_for(lambda: receiver.read(queue, timeout=0.5))
    assert message.headers["price"] == 2.75
    assert isinstance(message.headers["price"], float)


def test_an_original_without_a_message_id_goes_to_the_invalid_queue(
    pg_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    """Its failed attempts could not be counted: it would be retried forever."""
    receiver = make_receiver(pg_url)
    queue = receiver_queue(receiver, unique_name)
    (nameless,) = copy_messages(queue)
    (good,) = copy_messages(queue)
    publish(channel, _with(nameless, message_id=None))
    publish(channel, good)

    with receiver.transaction() as tx:
        message = wait_for(lambda: tx.read(queue, timeout=0.5))
    assert message.message_id == good.message_id
    moved = get_all(channel, receiver.invalid_queue)
    assert [props.headers[protocol.H_REASON] for props, _ in moved] == [
        "an original copy needs a message_id (its failed attempts are counted under it)"
    ]
    assert [props.headers[protocol.H_CM_ID] for props, _ in moved] == [
        (nameless.headers or {})[protocol.H_CM_ID]
    ]


def test_parts_whose_ids_exceed_64_characters_make_their_whole(
    pg_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    """A part's id is kept in no 64-character column: with a sequence id of 64
    characters, ``<seq id>.<position>`` is longer, and the sequence is delivered."""
    receiver = make_receiver(pg_url)
    queue = receiver_queue(receiver, unique_name)
    seq_id = "s" * 64
    parts = copy_messages(queue, b"abcdefghij" * 3, part_bytes=10)
    for part in parts:
        position = (part.headers or {})[protocol.H_SEQ_POS]
        publish(channel, _with(part, message_id=f"{seq_id}.{position}", condmsg_seq_id=seq_id))

    message = wait_for(lambda: receiver.read(queue, timeout=0.5))
    assert message.payload == b"abcdefghij" * 3
    assert message.message_id == seq_id
    assert invalid_reasons(channel, receiver) == []


def _part_rows(receiver: Any) -> list[Any]:
    with receiver.engine.connect() as conn:
        return list(conn.execute(sa.select(sequence_parts).order_by(sequence_parts.c.position)))


def test_parts_moved_from_the_store_keep_their_headers_and_name_their_queue(
    pg_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    """Byte strings are written to ``headers_json`` as UTF-8 text at any depth; the parts
    of a sequence incomplete at its timeout reach the invalid queue with the headers read
    back from there and the queue they were read from."""
    receiver = make_receiver(pg_url, sequence_timeout=timedelta(seconds=1))
    queue = receiver_queue(receiver, unique_name)
    app: dict[str, Any] = {"blob": b"caf\xc3\xa9\xff", "nested": {"list": [b"x", 1]}}
    for part in copy_messages(queue, b"a" * 30, part_bytes=10)[:2]:  # part 3 never comes
        headers = {**(part.headers or {}), **app}  # bytes: more than an outbox row holds
        properties = pika.BasicProperties(
            message_id=part.message_id, reply_to=part.reply_to, headers=headers
        )
        channel.basic_publish("", queue, part.body, properties)
    assert receiver.read(queue, timeout=0.5) is None
    stored = [json.loads(row.headers_json) for row in _part_rows(receiver)]
    assert [(h["blob"], h["nested"]) for h in stored] == [
        ("caf\u00e9\ufffd", {"list": ["x", 1]}),
        ("caf\u00e9\ufffd", {"list": ["x", 1]}),
    ]

    moved = wait_for(
        lambda: receiver.read(queue, timeout=0.3) or get_all(channel, receiver.invalid_queue),
        timeout=15,
    )
    assert sorted(props.headers[protocol.H_REASON] for props, _ in moved) == [
        f"incomplete sequence {stored[0]['condmsg-seq-id']}: part {n} of 3, "
        "others missing after 0:00:01"
        for n in (1, 2)
    ]
    for props, _ in moved:
        assert props.headers[protocol.H_ORIGINAL_QUEUE] == queue
        assert props.headers["nested"] == {"list": ["x", 1]}


@pytest.mark.parametrize("transactional", [False, True], ids=["read", "transaction"])
def test_a_part_of_a_sequence_taken_already_is_dropped(
    pg_url: str, unique_name: str, make_receiver: Any, channel: Any, transactional: bool
) -> None:
    """Its broker ack was lost after the commit that stored it (or it was published
    twice): the receiver log shows its whole was taken, so it is acked and not stored,
    instead of reaching the invalid queue as an incomplete sequence at the timeout."""
    receiver = make_receiver(pg_url)
    queue = receiver_queue(receiver, unique_name)
    parts = copy_messages(queue, b"abcdefghij" * 3, part_bytes=10)
    for part in parts:
        publish(channel, part)
    whole = wait_for(lambda: receiver.read(queue, timeout=0.5))
    assert whole.payload == b"abcdefghij" * 3

    publish(channel, parts[1])
    if transactional:
        with receiver.transaction() as tx:
            assert tx.read(queue, timeout=0.5) is None
    else:
        assert receiver.read(queue, timeout=0.5) is None
    assert _part_rows(receiver) == []
    assert receiver.stats.duplicates == 1
    assert channel.queue_declare(queue, passive=True).method.message_count == 0
    assert get_all(channel, receiver.invalid_queue) == []
