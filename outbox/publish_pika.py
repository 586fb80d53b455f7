"""Putting the messages of a claimed batch on the publishing channel: the seam, and its
plain path through pika's public API.

:class:`Publishing` is the seam between the :class:`~outbox.publish_confirms.Publisher`
(which owns the connection, the exchange checks and the delivery-tag bookkeeping) and the
bytes on the wire. It has two implementations: :class:`PikaPublishing`, here, publishes
each message with pika's public ``channel.basic_publish``; the fast path,
:class:`outbox.publish_frames.FramePublishing`, encodes the frames itself and writes a
batch with few socket writes. Both publish the same messages
with the same properties and headers, and refuse the same rows for the same reasons, with
one exception: pika has no encoder for floats, so under :class:`PikaPublishing` a row with
a float header is refused ("cannot encode a float as an AMQP field value") where the frames
send it as an AMQP double.

Each message carries its row id in the ``x-outbox-id`` header, and a copy of a fan-out row
its copy number in ``x-outbox-copy``: a ``basic.return`` carries no delivery tag, so the
headers are how the publisher tells which message came back. A row's own headers of those
names are dropped (ours win).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import partial
from typing import Any, Protocol, Self, TypeVar

import pika.data
import pika.exceptions
from pika.channel import Channel
from pika.spec import BasicProperties

from outbox.errors import OutboxValueError
from outbox.message import OutboxMessage, StoredMessage

#: Header that carries the outbox row id on every published message.
ROW_ID_HEADER = "x-outbox-id"
#: Header that carries a message's copy number within a fan-out row (absent otherwise).
COPY_HEADER = "x-outbox-copy"
OURS = (ROW_ID_HEADER, COPY_HEADER)

#: One published message: (row id, copy number; None for a plain row).
MessageKey = tuple[int, int | None]
#: What became of one message: its key, and None once it is on the channel (a delivery
#: tag is due) or the reason it was refused without being published.
Outcome = tuple[MessageKey, str | None]

_INT64 = (-(2**63), 2**63)

P = TypeVar("P")


class AmqpEncodingError(OutboxValueError):
    """A value that cannot travel in an AMQP message (a name over 255 bytes, a huge int)."""

    @classmethod
    def too_long(cls, value: str) -> Self:
        return cls(f"{value[:40]!r}... is longer than 255 bytes")

    @classmethod
    def too_big(cls, value: int) -> Self:
        return cls(f"header value {value} does not fit 64 bits")

    @classmethod
    def unsupported(cls, value: object) -> Self:
        return cls(f"cannot encode a {type(value).__name__} as an AMQP field value")


class Publishing(Protocol):
    """Puts the messages of a batch on a confirm-mode channel, in order."""

    #: The name ``RelayConfig.publishing`` selects this implementation by.
    name: str

    def publish(
        self, channel: Channel, rows: Sequence[StoredMessage], missing: Collection[str]
    ) -> list[Outcome]:
        """Publish the messages of ``rows`` on ``channel`` in row order, except those
        addressed to an exchange in ``missing``; one :data:`Outcome` per message, in the
        order of publishing (the order of their delivery tags)."""
        ...


def each_message(
    rows: Sequence[StoredMessage],
    missing: Collection[str],
    messages: Callable[[StoredMessage], list[tuple[MessageKey, OutboxMessage, P]]],
    put: Callable[[OutboxMessage, P], None],
) -> list[Outcome]:
    """The loop both implementations share: ``messages`` expands a row into its messages
    with what ``put`` needs to publish each; either raises :class:`AmqpEncodingError` to
    refuse the whole row or the one message."""
    hint = "declare it, then requeue the row: condmsg outbox requeue --ids ID"
    outcomes: list[Outcome] = []
    for row in rows:
        try:
            prepared = messages(row)
        except AmqpEncodingError as exc:
            # Never raise in the I/O loop: the publisher would die, the row go back and
            # stop the relay again on every claim. Park it with the reason.
            outcomes += [(key, f"cannot be encoded as AMQP: {exc}") for key in row_keys(row)]
            continue
        for key, message, payload in prepared:
            if message.exchange in missing:
                reason = f"exchange {message.exchange!r} does not exist (404 NOT_FOUND); {hint}"
                outcomes.append((key, reason))
                continue
            try:
                put(message, payload)
            except AmqpEncodingError as exc:
                outcomes.append((key, f"cannot be encoded as AMQP: {exc}"))
                continue
            outcomes.append((key, None))
    return outcomes


def row_keys(row: StoredMessage) -> list[MessageKey]:
    """The keys of the messages of a claimed row (without encoding them)."""
    if not row.copies:
        return [(row.id, None)]
    return [(row.id, int(copy["n"])) for copy in row.copies]


def without_ours(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """A row's headers without those the publisher sets itself."""
    if not headers:
        return {}
    return {k: v for k, v in headers.items() if k not in OURS}


def pika_properties(
    row_id: int, message: OutboxMessage, copy: int | None = None
) -> BasicProperties:
    """The AMQP properties of ``message``, with its row id in the ``x-outbox-id`` header
    and, for a copy of a fan-out row, its number in ``x-outbox-copy``."""
    headers = without_ours(message.headers)
    headers[ROW_ID_HEADER] = row_id
    if copy is not None:
        headers[COPY_HEADER] = copy
    return BasicProperties(
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        headers=headers,
        delivery_mode=2 if message.persistent else 1,
        priority=message.priority,
        correlation_id=message.correlation_id,
        reply_to=message.reply_to,
        expiration=None if message.expiration_ms is None else str(message.expiration_ms),
        message_id=message.message_id,
        type=message.message_type,
    )


class PikaPublishing:
    """Each message through pika's public ``channel.basic_publish`` (which encodes it with
    pika's own field-table encoder and writes its frames one by one)."""

    name = "pika"

    def publish(
        self, channel: Channel, rows: Sequence[StoredMessage], missing: Collection[str]
    ) -> list[Outcome]:
        messages = partial(_pika_messages, missing=missing)
        return each_message(rows, missing, messages, partial(_put, channel))


def _pika_messages(
    row: StoredMessage, *, missing: Collection[str]
) -> list[tuple[MessageKey, OutboxMessage, BasicProperties]]:
    if not row.copies:
        props = pika_properties(row.id, row.message)
        if row.message.exchange in missing:
            # A row that cannot be encoded is refused for that first, whatever its exchange.
            _check(props.headers)
        return [((row.id, None), row.message, props)]
    # One copy that cannot be encoded refuses the whole row, checked before any copy is
    # published: the shared headers first, then each copy's own.
    _check(without_ours(row.message.headers))
    for copy in row.copies:
        _check(without_ours(copy.get("headers")))
    return [
        ((row.id, n), message, pika_properties(row.id, message, n)) for n, message in row.expand()
    ]


def _put(channel: Channel, message: OutboxMessage, props: BasicProperties) -> None:
    # pika marshals all three frames before writing any, so a refusal writes nothing.
    try:
        channel.basic_publish(
            message.exchange,
            message.routing_key,
            message.body,
            properties=props,
            mandatory=message.mandatory,
        )
    except _PIKA_ENCODING_ERRORS as exc:
        raise _translated(exc, props.headers) from None


def _check(headers: Mapping[str, Any] | None) -> None:
    try:
        pika.data.encode_table([], dict(headers or {}))
    except _PIKA_ENCODING_ERRORS as exc:
        raise _translated(exc, headers) from None


#: What pika's encoder raises for a value AMQP cannot carry: a short string over 255 bytes,
#: a type it has no encoder for, an int beyond 64 bits (from ``struct.pack``).
_PIKA_ENCODING_ERRORS = (
    pika.exceptions.ShortStringTooLong,
    pika.exceptions.UnsupportedAMQPFieldException,
    struct.error,
)


def _translated(exc: Exception, headers: Mapping[str, Any] | None) -> AmqpEncodingError:
    """The refusal pika's ``exc`` means, worded as the frame encoder words it."""
    if isinstance(exc, pika.exceptions.ShortStringTooLong):
        return AmqpEncodingError.too_long(bytes(exc.args[0]).decode(errors="replace"))
    if isinstance(exc, pika.exceptions.UnsupportedAMQPFieldException):
        return AmqpEncodingError.unsupported(exc.args[1])
    value = _first_too_big(headers)
    return AmqpEncodingError(str(exc)) if value is None else AmqpEncodingError.too_big(value)


def _first_too_big(value: Any) -> int | None:
    """The first int beyond 64 bits in ``value``, in the order pika encodes it."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if _INT64[0] <= value < _INT64[1] else value
    if isinstance(value, Mapping):
        value = list(value.values())
    if not isinstance(value, list):
        return None
    for item in value:
        found = _first_too_big(item)
        if found is not None:
            return found
    return None
