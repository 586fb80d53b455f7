"""The message a row of the outbox holds: an AMQP publish, validated at enqueue time.

Validation happens when the message is built, inside the caller's transaction, so that a bad
message fails the business transaction that produced it instead of poisoning the relay later.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from outbox.errors import OutboxTypeError, OutboxValueError

#: AMQP ``shortstr`` fields (exchange, routing key, ids) hold at most 255 bytes.
MAX_SHORTSTR_BYTES = 255
#: RabbitMQ 3.10 refuses messages above ``max_message_size`` (128 MiB by default) by closing
#: the channel; refusing them here keeps such a row out of the relay entirely.
MAX_BODY_BYTES = 128 * 1024 * 1024

HeaderValue = str | int | float | bool | None | list[Any] | dict[str, Any]

#: The optional AMQP ``shortstr`` properties of a message.
_OPTIONAL_NAMES = (
    "message_id",
    "correlation_id",
    "reply_to",
    "content_type",
    "content_encoding",
    "message_type",
)


#: A str this short fits a shortstr whatever its characters (UTF-8 takes at most 4 bytes
#: per character), so only longer ones are encoded to count their bytes.
_SURELY_SHORT = MAX_SHORTSTR_BYTES // 4


def _shortstr(name: str, value: object, *, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise OutboxTypeError(f"{name} must be a str, got {type(value).__name__}")
    if len(value) > _SURELY_SHORT and len(value.encode("utf-8")) > MAX_SHORTSTR_BYTES:
        raise OutboxValueError(f"{name} is longer than {MAX_SHORTSTR_BYTES} bytes")


_SCALARS = (str, bool, int, type(None))


def _check_json(path: str, value: object) -> None:
    """Raise unless ``value`` is made of JSON values (finite floats, str keys)."""
    # The paths of the error messages are built only on the way to an error: this runs
    # for every header of every enqueued message.
    if isinstance(value, _SCALARS):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise OutboxValueError(f"{path} must be a finite number, got {value!r}")
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            if not isinstance(item, _SCALARS):
                _check_json(f"{path}[{i}]", item)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise OutboxTypeError(f"{path} keys must be str, got {type(key).__name__}")
            if not isinstance(item, _SCALARS):
                _check_json(f"{path}[{key!r}]", item)
        return
    raise OutboxTypeError(
        f"{path} must hold JSON values (str, int, float, bool, None, list, dict), "
        f"got {type(value).__name__}"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxMessage:
    """One AMQP publish: where it goes, its body, and the properties RabbitMQ sees.

    ``expiration_ms`` is the per-message TTL in milliseconds; ``persistent`` maps to
    ``delivery_mode`` 2 (true) or 1; ``mandatory`` makes an unroutable message come back
    (``basic.return``) so the relay can park it instead of RabbitMQ dropping it.
    ``headers`` hold JSON values only (they are stored as JSON).
    """

    exchange: str
    routing_key: str
    body: bytes
    message_id: str | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    content_type: str | None = None
    content_encoding: str | None = None
    message_type: str | None = None
    headers: Mapping[str, HeaderValue] | None = None
    priority: int | None = None
    expiration_ms: int | None = None
    persistent: bool = True
    mandatory: bool = True

    def __post_init__(self) -> None:
        body: object = self.body  # callers without type checking pass anything
        if isinstance(body, bytearray | memoryview):
            body = bytes(body)
            object.__setattr__(self, "body", body)
        check_body(body)
        for name in COPY_FIELDS:
            check_field(name, getattr(self, name))
        if self.headers is not None:
            _check_headers(self.headers)

    @classmethod
    def trusted(cls, **fields: Any) -> OutboxMessage:
        """Rebuild a message read back from the table, skipping validation (it was
        validated when enqueued); the relay's hot path reads thousands per second."""
        message = object.__new__(cls)
        for name, value in fields.items():
            object.__setattr__(message, name, value)
        return message

    def headers_text(self) -> str | None:
        """Headers as one JSON document (what the JSON column holds), or ``None``."""
        if self.headers is None:
            return None
        return json.dumps(dict(self.headers), separators=(",", ":"))

    def headers_json(self) -> dict[str, Any] | None:
        """Headers as a plain dict (what the JSON column stores), or ``None``."""
        if self.headers is None:
            return None
        return dict(json.loads(json.dumps(dict(self.headers))))


#: The fields a copy of a fan-out row may set for itself (the body is always shared).
COPY_FIELDS = (
    "exchange",
    "routing_key",
    *_OPTIONAL_NAMES,
    "priority",
    "expiration_ms",
    "persistent",
    "mandatory",
)


_SHORTSTR_FIELDS = frozenset({"exchange", "routing_key", *_OPTIONAL_NAMES})
_MAY_BE_NONE = frozenset({*_OPTIONAL_NAMES, "priority", "expiration_ms"})
_FLAGS = frozenset({"persistent", "mandatory"})


def check_body(body: object) -> None:
    """Raise unless ``body`` is a message body: bytes RabbitMQ accepts."""
    if not isinstance(body, bytes):
        hint = "; encode it first, e.g. body.encode('utf-8')" if isinstance(body, str) else ""
        raise OutboxTypeError(f"body must be bytes, got {type(body).__name__}{hint}")
    if len(body) > MAX_BODY_BYTES:
        raise OutboxValueError(
            f"body is {len(body)} bytes; RabbitMQ accepts at most {MAX_BODY_BYTES}"
        )


def check_field(name: str, value: object) -> None:
    """Raise unless ``value`` is valid for the message field ``name`` (one of COPY_FIELDS)."""
    # Plainly valid values pass first, without the branches below (this runs per field of
    # every message).
    if value is None:
        if name in _MAY_BE_NONE:
            return
    elif type(value) is str:
        if name in _SHORTSTR_FIELDS and len(value) <= _SURELY_SHORT:
            return
    elif type(value) is bool and name in _FLAGS:
        return
    if name in _OPTIONAL_NAMES:
        _shortstr(name, value, optional=True)
    elif name in ("exchange", "routing_key"):
        _shortstr(name, value, optional=False)
    elif name == "priority":
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255
        ):
            raise OutboxValueError(f"priority must be an int in 0..255, got {value!r}")
    elif name == "expiration_ms":
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 0
        ):
            raise OutboxValueError(
                f"expiration_ms must be a non-negative int (milliseconds), got {value!r}"
            )
    elif not isinstance(value, bool):  # persistent, mandatory
        raise OutboxTypeError(f"{name} must be a bool")


def _check_headers(headers: object) -> None:
    if not isinstance(headers, Mapping):
        raise OutboxTypeError(f"headers must be a dict, got {type(headers).__name__}")
    _check_json("headers", dict(headers))


#: Every field of a message (a column of its own in the outbox table).
MESSAGE_FIELDS = (*COPY_FIELDS, "body", "headers")


@dataclass(frozen=True, slots=True)
class Fanout:
    """Messages with one body, in the form one outbox row stores them (see
    :func:`outbox.enqueueing.enqueue_fanouts`): ``message`` holds the body and what every
    message shares, headers included; ``copies`` one mapping per message with the fields
    (of :data:`COPY_FIELDS`) it sets for itself and its own ``headers``, which are added
    to the shared ones. Validated when built, as :class:`OutboxMessage` is.
    """

    message: OutboxMessage
    copies: tuple[Mapping[str, Any], ...]

    def __post_init__(self) -> None:
        if not isinstance(self.message, OutboxMessage):
            raise OutboxTypeError(f"a fan-out's message is an OutboxMessage, got {self.message!r}")
        if not self.copies:
            raise OutboxValueError("a fan-out has at least one copy")
        for copy in self.copies:
            for name, value in copy.items():
                if name == "headers":
                    _check_headers(value)
                elif name in COPY_FIELDS:
                    check_field(name, value)
                else:
                    raise OutboxTypeError(f"a copy of a fan-out cannot set {name!r}")
            if self.message.headers is None and copy.get("headers"):
                raise OutboxValueError("copies add headers to the shared ones: set headers={}")

    def messages(self) -> list[OutboxMessage]:
        """Each copy as a message of its own."""
        return [copy_message(self.message, c) for c in self.copies]


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredMessage:
    """A row the relay claimed: the table's id, bookkeeping and the message itself.

    ``created_at`` is UTC (the enqueuing process's clock). A *fan-out* row (see
    :func:`outbox.enqueueing.enqueue_fanouts`) holds several messages with one body:
    ``message`` carries what they share (its headers are the headers common to all) and
    ``copies`` one JSON object per message with its copy number ``n``, the fields in which
    it differs from ``message`` and its own ``headers``. A plain row has no ``copies``.
    """

    id: int
    created_at: datetime
    attempts: int
    message: OutboxMessage = field(repr=False)
    copies: tuple[dict[str, Any], ...] = field(default=(), repr=False)

    def expand(self) -> list[tuple[int | None, OutboxMessage]]:
        """The messages of the row with their copy numbers (``None`` for a plain row)."""
        if not self.copies:
            return [(None, self.message)]
        return [(int(c["n"]), copy_message(self.message, c)) for c in self.copies]


def copy_message(base: OutboxMessage, copy: Mapping[str, Any]) -> OutboxMessage:
    """The message of one copy of a fan-out row: ``base`` with the copy's own fields."""
    if not copy:
        return base  # a copy that states nothing of its own is the message itself
    fields = {name: copy.get(name, getattr(base, name)) for name in COPY_FIELDS}
    own = copy.get("headers")
    headers = base.headers if not own else {**(base.headers or {}), **own}
    return OutboxMessage.trusted(body=base.body, headers=headers, **fields)
