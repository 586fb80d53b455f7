"""AMQP 0-9-1 ``basic.publish`` frames, encoded for a whole batch at once, and
:class:`FramePublishing`, the :class:`~outbox.publish_pika.Publishing` that writes them.

The relay publishes thousands of messages per second from one Python thread. pika's
``basic_publish`` builds a method object, two frame objects and a properties object per
message, encodes the headers through its generic field-table encoder and hands each of the
three frames to the socket as a separate write. Here a message is encoded straight to
bytes (a fan-out row's shared properties once, not once per copy), and the publisher writes
a batch's frames with one call. The bytes are exactly what pika sends for the same message
(tested against pika's encoder), with one addition: float header values are encoded as
AMQP doubles (``d``), which pika's encoder refuses.

The frames reach the socket through pika's private ``Connection._adapter_emit_data``, the
hook under ``basic_publish``, and rely on pika's frame layout and its connection's
``params.frame_max``. So they run only with the pika releases they were tested with
(:data:`TESTED_PIKA`) and pika's ``basic_publish`` runs with any other
(:func:`pika_gate`, :mod:`condmsg.infra.fastpaths.gate`).
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import pika
from pika.channel import Channel
from pika.connection import Connection

from condmsg.infra.fastpaths.gate import Gate
from outbox.message import COPY_FIELDS, OutboxMessage, StoredMessage
from outbox.publish_pika import (
    COPY_HEADER,
    OURS,
    ROW_ID_HEADER,
    AmqpEncodingError,
    MessageKey,
    Outcome,
    each_message,
)

_FRAME_METHOD, _FRAME_HEADER, _FRAME_BODY, _FRAME_END = 1, 2, 3, 0xCE
_BASIC_CLASS = 60
#: Frame type, channel, payload size; then class 60, method 40 (publish), ticket 0.
_PUBLISH_PREFIX = struct.Struct(">BHIHHH")
#: Frame type, channel, payload size; then class 60, weight 0, body size.
_HEADER_PREFIX = struct.Struct(">BHIHHQ")
_FRAME_START = struct.Struct(">BHI")
_END = bytes([_FRAME_END])

_FLAG_CONTENT_TYPE = 1 << 15
_FLAG_CONTENT_ENCODING = 1 << 14
_FLAG_HEADERS = 1 << 13
_FLAG_DELIVERY_MODE = 1 << 12
_FLAG_PRIORITY = 1 << 11
_FLAG_CORRELATION_ID = 1 << 10
_FLAG_REPLY_TO = 1 << 9
_FLAG_EXPIRATION = 1 << 8
_FLAG_MESSAGE_ID = 1 << 7
_FLAG_TYPE = 1 << 5

_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_2_31 = 2**31
_F64 = struct.Struct(">d")

#: Frames handed to the socket per write (one write per message would be three).
_WRITE_BYTES = 256 * 1024

#: The pika releases the frames are tested with, from and up to (excluded): byte for byte
#: against pika's encoder (tests/unit/test_outbox_frames.py) and against the broker
#: (tests/contract/test_publishing.py). Widen it after both pass on a new release.
TESTED_PIKA = ((1, 3, 2), (1, 5))


def pika_gate() -> Gate:
    """Whether the pika imported is a release the frames were tested with and has the
    private hook they are written through."""
    return Gate.check(
        "pika",
        str(getattr(pika, "__version__", "unknown")),
        TESTED_PIKA,
        [("Connection._adapter_emit_data", Connection, "_adapter_emit_data")],
    )


class FrameEncodingError(AmqpEncodingError):
    """A value the frame encoder cannot put in an AMQP message."""


def shortstr(value: str) -> bytes:
    """An AMQP short string: length octet, UTF-8 bytes (at most 255)."""
    raw = value.encode()
    if len(raw) > 255:
        raise FrameEncodingError.too_long(value)
    return bytes((len(raw),)) + raw


def field_value(value: Any) -> bytes:
    """One field-table value, with the type tags pika uses (``S``, ``t``, ``I`` or ``l``,
    ``F``, ``A``, ``V``; ``x`` for bytes) and ``d`` for floats."""
    if isinstance(value, str):
        raw = value.encode()
        return b"S" + _U32.pack(len(raw)) + raw
    if isinstance(value, bool):
        return b"t\x01" if value else b"t\x00"
    if isinstance(value, int):
        if -_2_31 <= value < _2_31:
            return b"I" + _I32.pack(value)
        try:
            return b"l" + _I64.pack(value)
        except struct.error:
            raise FrameEncodingError.too_big(value) from None
    if value is None:
        return b"V"
    if isinstance(value, float):
        return b"d" + _F64.pack(value)
    if isinstance(value, dict):
        return b"F" + field_table(value)
    if isinstance(value, list):
        items = b"".join(field_value(v) for v in value)
        return b"A" + _U32.pack(len(items)) + items
    if isinstance(value, bytes):
        return b"x" + _U32.pack(len(value)) + value
    raise FrameEncodingError.unsupported(value)


def table_entries(table: Mapping[str, Any]) -> bytes:
    """The entries of a field table without its length prefix (entries concatenate)."""
    return b"".join(shortstr(k) + field_value(v) for k, v in table.items())


def field_table(table: Mapping[str, Any]) -> bytes:
    entries = table_entries(table)
    return _U32.pack(len(entries)) + entries


def properties(message: OutboxMessage, headers: bytes | None) -> bytes:
    """The basic-class property flags and list of ``message``; ``headers`` are the already
    encoded table entries (without the table's length prefix), None for no headers."""
    flags = _FLAG_DELIVERY_MODE
    parts = [b""]  # the flags, once known
    for flag, text in (
        (_FLAG_CONTENT_TYPE, message.content_type),
        (_FLAG_CONTENT_ENCODING, message.content_encoding),
    ):
        if text is not None:
            flags |= flag
            parts.append(shortstr(text))
    if headers is not None:
        flags |= _FLAG_HEADERS
        parts += (_U32.pack(len(headers)), headers)
    parts.append(b"\x02" if message.persistent else b"\x01")
    if message.priority is not None:
        flags |= _FLAG_PRIORITY
        parts.append(bytes((message.priority,)))
    expiration = None if message.expiration_ms is None else str(message.expiration_ms)
    for flag, text in (
        (_FLAG_CORRELATION_ID, message.correlation_id),
        (_FLAG_REPLY_TO, message.reply_to),
        (_FLAG_EXPIRATION, expiration),
        (_FLAG_MESSAGE_ID, message.message_id),
        (_FLAG_TYPE, message.message_type),
    ):
        if text is not None:
            flags |= flag
            parts.append(shortstr(text))
    parts[0] = flags.to_bytes(2, "big")
    return b"".join(parts)


def publish(
    channel: int,
    *,
    exchange: str,
    routing_key: str,
    mandatory: bool,
    props: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    """The method, header and body frames of one ``basic.publish``; the body is split into
    frames of at most ``frame_max`` bytes (frame overhead included), as the broker requires."""
    args = shortstr(exchange) + shortstr(routing_key) + (b"\x01" if mandatory else b"\x00")
    parts = [
        _PUBLISH_PREFIX.pack(_FRAME_METHOD, channel, 6 + len(args), _BASIC_CLASS, 40, 0),
        args,
        _END,
        _HEADER_PREFIX.pack(_FRAME_HEADER, channel, 12 + len(props), _BASIC_CLASS, 0, len(body)),
        props,
        _END,
    ]
    step = frame_max - 8
    for start in range(0, len(body), step):
        chunk = body[start : start + step]
        parts += (_FRAME_START.pack(_FRAME_BODY, channel, len(chunk)), chunk, _END)
    return b"".join(parts)


class FramePublishing:
    """Each message encoded here; a batch's frames handed to the socket in writes of up to
    256 KiB (pika's ``basic_publish`` makes three writes per message)."""

    name = "frames"

    def publish(
        self, channel: Channel, rows: Sequence[StoredMessage], missing: Collection[str]
    ) -> list[Outcome]:
        conn = channel.connection
        number, frame_max = channel.channel_number, conn.params.frame_max
        out: list[bytes] = []
        size = 0

        def put(message: OutboxMessage, headers: bytes) -> None:
            nonlocal size
            data = encode(message, headers, number, frame_max)
            out.append(data)
            size += len(data)
            if size >= _WRITE_BYTES:
                _write(conn, out)
                size = 0

        outcomes = each_message(rows, missing, row_messages, put)
        _write(conn, out)
        return outcomes


def row_messages(row: StoredMessage) -> list[tuple[MessageKey, OutboxMessage, bytes]]:
    """The messages of a claimed row with their keys and encoded header entries (the
    row's own id, and copy number, last). The headers a fan-out row's copies share are
    encoded once for the row."""
    base = row.message
    if not row.copies:
        entries = _entries(base.headers) + _entry(ROW_ID_HEADER, row.id)
        return [((row.id, None), base, entries)]
    common = _entries(base.headers) + _entry(ROW_ID_HEADER, row.id)
    shared = base.headers or {}
    out: list[tuple[MessageKey, OutboxMessage, bytes]] = []
    for copy in row.copies:
        n = int(copy["n"])
        message = base
        if len(copy) > 1 + ("headers" in copy):  # fields of its own besides n and headers
            fields = {name: copy.get(name, getattr(base, name)) for name in COPY_FIELDS}
            message = OutboxMessage.trusted(body=base.body, headers=None, **fields)
        own = copy.get("headers")
        if own and any(k in shared for k in own):
            # A copy's header overrides a shared one (as in copy_message): one entry per
            # name, or the broker (first entry) and consumers (last) would disagree.
            merged = _entries({**shared, **own}) + _entry(ROW_ID_HEADER, row.id)
            entries = merged + _entry(COPY_HEADER, n)
        else:
            entries = common + _entries(own) + _entry(COPY_HEADER, n)
        out.append(((row.id, n), message, entries))
    return out


def encode(message: OutboxMessage, headers: bytes, channel: int, frame_max: int) -> bytes:
    """The frames of one ``basic.publish`` of ``message`` with the encoded ``headers``."""
    return publish(
        channel,
        exchange=message.exchange,
        routing_key=message.routing_key,
        mandatory=message.mandatory,
        props=properties(message, headers),
        body=message.body,
        frame_max=frame_max,
    )


def _entries(headers: Any) -> bytes:
    if not headers:
        return b""
    if any(k in headers for k in OURS):  # the publisher's own headers win
        headers = {k: v for k, v in headers.items() if k not in OURS}
    return table_entries(headers)


def _entry(name: str, value: int) -> bytes:
    return shortstr(name) + field_value(value)


def _write(conn: Connection, out: list[bytes]) -> None:
    """Hand encoded frames to the connection's socket buffer as one write."""
    if out:
        # pika's adapter hook under basic_publish; the channel's own bookkeeping is not
        # needed (the publisher counts delivery tags itself).
        conn._adapter_emit_data(b"".join(out))  # type: ignore[attr-defined]
        out.clear()
