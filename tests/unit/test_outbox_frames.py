"""The relay's own basic.publish encoding is byte for byte what pika sends."""

from __future__ import annotations

import struct
from datetime import UTC, datetime

import pytest
from pika import frame, spec
from pika.data import decode_short_string, decode_table, decode_value

from outbox import frames
from outbox.frames import encode, row_messages
from outbox.message import OutboxMessage, StoredMessage
from outbox.publishing import COPY_HEADER, ROW_ID_HEADER, pika_properties

FRAME_MAX = 131072
OURS = (ROW_ID_HEADER, COPY_HEADER)
_U32 = struct.Struct(">I")

HEADERS = {
    "small": 1,
    "big": -(2**40),
    "flag": True,
    "off": False,
    "none": None,
    "text": "é",
    "list": [1, "a", {"x": False}],
    "nested": {"k": [None, "v"]},
}


def pika_frames(message: OutboxMessage, row_id: int, channel: int) -> bytes:
    props = pika_properties(row_id, message)
    body = message.body
    step = FRAME_MAX - 8
    parts = [
        frame.Method(
            channel,
            spec.Basic.Publish(
                exchange=message.exchange,
                routing_key=message.routing_key,
                mandatory=message.mandatory,
            ),
        ).marshal(),
        frame.Header(channel, len(body), props).marshal(),
        *(frame.Body(channel, body[i : i + step]).marshal() for i in range(0, len(body), step)),
    ]
    return b"".join(parts)


def ours(message: OutboxMessage, row_id: int, channel: int) -> bytes:
    row = StoredMessage(id=row_id, created_at=datetime.now(UTC), attempts=0, message=message)
    [(key, same, entries)] = row_messages(row)
    assert key == (row_id, None) and same is message
    return encode(message, entries, channel, FRAME_MAX)


@pytest.mark.parametrize("size", [0, 1, 256, FRAME_MAX - 8, FRAME_MAX - 7, 3 * FRAME_MAX + 5])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"headers": HEADERS},
        {
            "exchange": "ex",
            "message_id": "m",
            "correlation_id": "c",
            "reply_to": "r",
            "content_type": "application/json",
            "content_encoding": "gzip",
            "message_type": "t",
            "headers": HEADERS,
            "priority": 9,
            "expiration_ms": 60000,
            "persistent": False,
            "mandatory": False,
        },
    ],
)
def test_publish_frames_equal_pikas(size: int, options: dict[str, object]) -> None:
    fields: dict[str, object] = {"exchange": "", "routing_key": "q.é", **options}
    message = OutboxMessage(body=bytes(range(256)) * (size // 256) + b"x" * (size % 256), **fields)  # type: ignore[arg-type]
    assert ours(message, 2**33, 7) == pika_frames(message, 2**33, 7)


def test_floats_travel_as_doubles() -> None:
    # pika's own encoder refuses floats (and its decoder truncates doubles to ints).
    assert frames.field_value(1.5) == b"d" + struct.pack(">d", 1.5)
    table = frames.field_table({"f": 1.5, "i": 3, "l": [0.25]})
    decoded, _ = decode_table(table, 0)
    assert decoded == {"f": 1, "i": 3, "l": [0]}


def test_values_that_cannot_travel_are_refused() -> None:
    with pytest.raises(frames.FrameEncodingError, match="255 bytes"):
        frames.shortstr("x" * 256)
    with pytest.raises(frames.FrameEncodingError, match="64 bits"):
        frames.field_value(2**64)
    with pytest.raises(frames.FrameEncodingError, match="set"):
        frames.field_value({1, 2})


def fanout_row(own_headers: list[dict[str, object]]) -> StoredMessage:
    base = OutboxMessage(
        exchange="",
        routing_key="q0",
        body=b"shared",
        message_id="m",
        headers={"cm": "c-1", "dest": "q0", "x-outbox-copy": 99},
    )
    copies = tuple(
        {"n": n, "routing_key": f"q{n}", "headers": own} for n, own in enumerate(own_headers)
    )
    return StoredMessage(
        id=12, created_at=datetime.now(UTC), attempts=0, message=base, copies=copies
    )


def table_keys(encoded: bytes) -> list[str]:
    """The entry names of an encoded field table, in order (duplicates kept)."""
    (size,) = struct.unpack_from(">I", encoded, 0)
    keys, offset = [], 4
    while offset < 4 + size:
        key, offset = decode_short_string(encoded, offset)
        keys.append(key)
        _, offset = decode_value(encoded, offset)
    return keys


@pytest.mark.parametrize(
    "own_headers",
    [
        [{"tok": "a"}, {"tok": "b"}],
        # A copy's own header overriding a shared one: the copy's value, in one entry.
        [{"dest": "q0"}, {"dest": "q1", "tok": "b"}],
    ],
)
def test_each_copy_of_a_fanout_row_travels_as_its_expanded_message(
    own_headers: list[dict[str, object]],
) -> None:
    row = fanout_row(own_headers)
    for (n, expected), (key, message, entries) in zip(row.expand(), row_messages(row), strict=True):
        assert key == (row.id, n)
        data = encode(message, entries, 3, FRAME_MAX)
        offset, method = frame.decode_frame(data)
        offset2, header = frame.decode_frame(data[offset:])
        _, body = frame.decode_frame(data[offset + offset2 :])
        assert isinstance(method, frame.Method) and isinstance(header, frame.Header)
        assert isinstance(body, frame.Body) and body.fragment == expected.body
        assert method.method.routing_key == expected.routing_key == f"q{n}"
        props = header.properties
        assert props.message_id == expected.message_id
        mine = {k: v for k, v in (expected.headers or {}).items() if k not in OURS}
        assert props.headers == mine | {ROW_ID_HEADER: row.id, COPY_HEADER: n}
        # Every name once: RabbitMQ reads the first entry of a name, pika the last.
        keys = table_keys(_U32.pack(len(entries)) + entries)
        assert sorted(keys) == sorted(props.headers)
