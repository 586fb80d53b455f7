"""The relay's own basic.publish encoding is byte for byte what pika sends, and both
publishing implementations refuse the same rows for the same reasons."""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from pika import frame, spec
from pika.data import decode_short_string, decode_table, decode_value

from outbox import publish_frames
from outbox.message import OutboxMessage, StoredMessage
from outbox.publish_frames import FramePublishing, encode, row_messages
from outbox.publish_pika import COPY_HEADER, ROW_ID_HEADER, PikaPublishing, pika_properties

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
    # pika's own encoder refuses floats, and its decoder truncates doubles to integers
    # unless ackd's field types are installed (as every Receiver does, process-wide):
    # install them, so that the result does not depend on which tests ran before.
    from ackd import field_types

    field_types.install()
    assert publish_frames.field_value(1.5) == b"d" + struct.pack(">d", 1.5)
    table = publish_frames.field_table({"f": 1.5, "i": 3, "l": [0.25]})
    decoded, _ = decode_table(table, 0)
    assert decoded == {"f": 1.5, "i": 3, "l": [0.25]}
    assert type(decoded["i"]) is not float


def test_values_that_cannot_travel_are_refused() -> None:
    with pytest.raises(publish_frames.FrameEncodingError, match="255 bytes"):
        publish_frames.shortstr("x" * 256)
    with pytest.raises(publish_frames.FrameEncodingError, match="64 bits"):
        publish_frames.field_value(2**64)
    with pytest.raises(publish_frames.FrameEncodingError, match="set"):
        publish_frames.field_value({1, 2})


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


class RecordingChannel:
    """A channel whose connection records what is written to its socket; its
    ``basic_publish`` marshals the frames as pika's ``Connection._send_message`` does."""

    channel_number = 5

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.connection = SimpleNamespace(
            params=SimpleNamespace(frame_max=FRAME_MAX), _adapter_emit_data=self.writes.append
        )

    def basic_publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: spec.BasicProperties,
        mandatory: bool,
    ) -> None:
        publish = spec.Basic.Publish(
            exchange=exchange, routing_key=routing_key, mandatory=mandatory
        )
        step = FRAME_MAX - 8
        self.writes += [
            frame.Method(self.channel_number, publish).marshal(),
            frame.Header(self.channel_number, len(body), properties).marshal(),
            *(
                frame.Body(self.channel_number, body[i : i + step]).marshal()
                for i in range(0, len(body), step)
            ),
        ]


def test_both_publishings_write_the_same_bytes_and_refuse_the_same_rows() -> None:
    def row(row_id: int, **fields: object) -> StoredMessage:
        fields = {"exchange": "", "routing_key": "q", "body": b"b" * 700, **fields}
        message = OutboxMessage(**fields)  # type: ignore[arg-type]
        return StoredMessage(id=row_id, created_at=datetime.now(UTC), attempts=0, message=message)

    rows = [
        row(1, headers=HEADERS, message_id="m", priority=3, expiration_ms=5),
        row(2, headers={"k" * 256: 1}),
        *(row(i, headers={"n": i}) for i in range(3, 600)),
        row(600, headers={"deep": [1, {"x": -(2**64)}]}),
        row(601, exchange="gone"),
        row(602, exchange="gone", headers={"big": 2**64}),
    ]
    written = {}
    outcomes = {}
    for publishing in (FramePublishing(), PikaPublishing()):
        channel = RecordingChannel()
        outcomes[publishing.name] = publishing.publish(channel, rows, {"gone"})  # type: ignore[arg-type]
        written[publishing.name] = channel.writes
    assert outcomes["pika"] == outcomes["frames"]
    assert b"".join(written["pika"]) == b"".join(written["frames"])
    # The frames go out in writes of at least 256 KiB (the last one apart).
    assert len(written["frames"]) == 2 and len(written["frames"][0]) >= 256 * 1024
    refused = {key: reason for key, reason in outcomes["frames"] if reason is not None}
    assert refused == {
        (2, None): f"cannot be encoded as AMQP: {'k' * 40!r}... is longer than 255 bytes",
        (600, None): f"cannot be encoded as AMQP: header value {-(2**64)} does not fit 64 bits",
        (601, None): "exchange 'gone' does not exist (404 NOT_FOUND); "
        "declare it, then requeue the row: condmsg outbox requeue --ids ID",
        (602, None): f"cannot be encoded as AMQP: header value {2**64} does not fit 64 bits",
    }
