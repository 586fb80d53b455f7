"""What makes an incoming message valid: its condmsg headers read strictly, its AMQP
message id, its token and its payload (:func:`judge` checks them in turn).

A message without ``condmsg-version`` is a plain message and passes through. A message that
claims to be condmsg's but whose headers are missing or malformed, or that fails a check,
raises :class:`InvalidMessage` with the reason; the receiver moves it to the
invalid-message queue.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeGuard

from condmsg.core import protocol
from condmsg.core.errors import CondmsgError, ProtocolError
from condmsg.core.limits import forbidden_character
from condmsg.core.payloads import decode_payload
from condmsg.infra import tracing

if TYPE_CHECKING:
    from ackd.broker import Delivery

#: The longest value of a header the receiver stores (its columns in ``ackd.tables``): a
#: longer one could never be stored on PostgreSQL, so the copy is invalid.
_LONGEST = {
    protocol.H_CM_ID: protocol.MAX_CM_ID_CHARS,
    protocol.H_DESTINATION: protocol.MAX_NAME_CHARS,
    protocol.H_RECIPIENT: protocol.MAX_NAME_CHARS,
    protocol.H_SENDER: protocol.MAX_NAME_CHARS,
    protocol.H_SEQ_ID: protocol.MAX_SEQ_ID_CHARS,
    protocol.H_TOKEN: 64,
    protocol.H_KIND: 16,
    protocol.H_REQUIRES: 16,
    protocol.H_SENT_AT: protocol.MAX_INSTANT_CHARS,
}
#: The longest AMQP message id of an original copy (its RLOG row keeps it).
LONGEST_COPY_MESSAGE_ID = 64
#: The largest number of parts of a Message Sequence (the store's integer columns).
MAX_SEQ_SIZE = 2**31 - 1
_TOKEN = re.compile(protocol.TOKEN_PATTERN)
_REQUIREMENTS = frozenset(r.value for r in protocol.Requirement)


class InvalidMessage(CondmsgError):
    """A message that cannot be accepted as valid; ``str(exc)`` is the reason."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Inbound:
    """The condmsg facts of one incoming message (``kind`` None: a plain message)."""

    kind: protocol.MessageKind | None
    cm_id: str | None = None
    destination: str | None = None
    recipient: str | None = None
    sender: str | None = None
    sent_at: datetime | None = None
    token: str | None = None
    reply_to: str | None = None
    seq_id: str | None = None
    seq_pos: int | None = None
    seq_size: int | None = None
    #: The W3C trace context the message carried (docs/tracing.md): ``traceparent`` if
    #: well formed, and then its ``tracestate``.
    traceparent: str | None = None
    tracestate: str | None = None


def _text(headers: dict[str, Any], name: str, *, required: bool = True) -> str | None:
    if name not in headers:
        if required:
            raise InvalidMessage(f"missing header {name}")
        return None
    value = headers[name]
    if isinstance(value, bytes):  # pika hands AMQP long strings over as bytes at times
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidMessage(f"header {name} is not UTF-8") from None
    if not isinstance(value, str) or not value:
        raise InvalidMessage(f"header {name} must be a non-empty string")
    bad = forbidden_character(value)
    if bad is not None:  # no PostgreSQL text holds a NUL: the RLOG and ack rows would fail
        raise InvalidMessage(f"header {name} contains {bad}")
    longest = _LONGEST.get(name)
    if longest is not None and len(value) > longest:
        raise InvalidMessage(f"header {name} is longer than {longest} characters")
    return value


def _is_integer(value: object) -> TypeGuard[int]:
    """An AMQP integer field of any width: pika hands a 64-bit one over as its own ``int``
    subclass; a boolean is not one, nor a double (``ackd.field_types`` keeps it a float)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _int(headers: dict[str, Any], name: str) -> int:
    value = headers.get(name)
    if not _is_integer(value):
        raise InvalidMessage(f"header {name} must be an integer, got {_show(value)}")
    return int(value)


def _show(value: object) -> str:
    if _is_integer(value):
        number = int(value)
        return "a large integer" if number.bit_length() > 64 else str(number)
    return (
        repr(value)[:40] if isinstance(value, str | bool | float | None) else type(value).__name__
    )


def parse(headers: dict[str, Any] | None, reply_to: str | None) -> Inbound:
    """The condmsg facts in ``headers``; raises :class:`InvalidMessage` if malformed, and
    nothing else for any header values (``condmsg/schema/headers.schema.json`` is the spec)."""
    try:
        return _parse(headers or {}, reply_to)
    except InvalidMessage:
        raise
    except Exception as exc:
        # A bug in the checks must cost one message (to the invalid queue), not the receiver.
        raise InvalidMessage(f"headers could not be read ({type(exc).__name__})") from exc


def _parse(headers: dict[str, Any], reply_to: str | None) -> Inbound:
    if not isinstance(headers, dict):
        raise InvalidMessage("headers must be a table")
    if protocol.H_VERSION not in headers:
        return Inbound(kind=None)
    version = headers[protocol.H_VERSION]
    if not _is_integer(version) or version != protocol.PROTOCOL_VERSION:  # not True, not 1.0
        raise InvalidMessage(f"unsupported {protocol.H_VERSION} {_show(version)}")
    raw_kind = _text(headers, protocol.H_KIND)
    try:
        kind = protocol.MessageKind(str(raw_kind))
    except ValueError:
        raise InvalidMessage(f"unknown {protocol.H_KIND} {raw_kind!r}") from None
    sent_raw = _text(headers, protocol.H_SENT_AT)
    try:
        sent_at = protocol.parse_instant(sent_raw, protocol.H_SENT_AT)
    except ProtocolError as exc:
        raise InvalidMessage(str(exc)) from None
    token = _text(headers, protocol.H_TOKEN, required=kind is protocol.MessageKind.ORIGINAL)
    if token is not None and not _TOKEN.fullmatch(token):
        raise InvalidMessage(f"header {protocol.H_TOKEN} is not a 64-digit hex HMAC (lowercase)")
    requires = _text(headers, protocol.H_REQUIRES, required=False)
    if requires is not None and requires not in _REQUIREMENTS:
        raise InvalidMessage(f"unknown {protocol.H_REQUIRES} {requires!r}")
    if kind is protocol.MessageKind.ORIGINAL and not reply_to:
        raise InvalidMessage("an original copy needs reply_to (the sender's ack queue)")
    if reply_to is not None and "\x00" in reply_to:
        raise InvalidMessage("reply_to contains a NUL character")
    trace = tracing.carried(headers)  # ignored when malformed: never makes a copy invalid
    inbound = Inbound(
        kind=kind,
        cm_id=_text(headers, protocol.H_CM_ID),
        destination=_text(headers, protocol.H_DESTINATION),
        recipient=_text(headers, protocol.H_RECIPIENT, required=False),
        sender=_text(headers, protocol.H_SENDER),
        sent_at=sent_at,
        token=token,
        reply_to=reply_to,
        traceparent=trace.get(tracing.TRACEPARENT),
        tracestate=trace.get(tracing.TRACESTATE),
    )
    if protocol.H_SEQ_ID not in headers:
        return inbound
    if kind is not protocol.MessageKind.ORIGINAL:
        raise InvalidMessage(f"a {kind.value} is never split into a sequence ({protocol.H_SEQ_ID})")
    seq_id = _text(headers, protocol.H_SEQ_ID)
    pos, size = _int(headers, protocol.H_SEQ_POS), _int(headers, protocol.H_SEQ_SIZE)
    if not 2 <= size <= MAX_SEQ_SIZE or not 0 <= pos < size:
        raise InvalidMessage(
            f"sequence position {_show(pos)} of size {_show(size)} is out of range"
        )
    return Inbound(
        kind=inbound.kind,
        cm_id=inbound.cm_id,
        destination=inbound.destination,
        recipient=inbound.recipient,
        sender=inbound.sender,
        sent_at=inbound.sent_at,
        token=inbound.token,
        reply_to=inbound.reply_to,
        seq_id=seq_id,
        seq_pos=pos,
        seq_size=size,
        traceparent=inbound.traceparent,
        tracestate=inbound.tracestate,
    )


def check_message_id(message_id: str | None, inbound: Inbound) -> None:
    """Reject a whole original copy without an AMQP message id, or with one that its RLOG
    row could not hold. Its failed attempts are counted under that id, so without one a
    copy that keeps failing could never reach ``max_attempts`` and would be retried
    forever. A part's id is not checked: the store keeps it only in the part's
    ``properties_json`` (text), and the whole is known by its sequence id, a header
    checked as such. Other messages' ids are only keys of the redelivery counts, which
    take any id."""
    if inbound.kind is not protocol.MessageKind.ORIGINAL or inbound.seq_id is not None:
        return
    if not message_id:
        raise InvalidMessage(
            "an original copy needs a message_id (its failed attempts are counted under it)"
        )
    if "\x00" in message_id:
        raise InvalidMessage("message_id contains a NUL character")
    if len(message_id) > LONGEST_COPY_MESSAGE_ID:
        raise InvalidMessage(f"message_id is longer than {LONGEST_COPY_MESSAGE_ID} characters")


def check_token(inbound: Inbound, secret: bytes | None, body: bytes) -> None:
    """With the deployment secret at hand, reject a message whose token is missing or does
    not verify: an original or a sequence part carries its copy's token (over CM id,
    destination and recipient), a compensation or success notice a control token that also
    covers ``body``. Without a secret nothing is checked (``docs/security.md``)."""
    if secret is None or inbound.kind is None:
        return
    assert inbound.cm_id and inbound.destination
    if inbound.token is None:
        raise InvalidMessage(
            f"missing header {protocol.H_TOKEN}: a {inbound.kind.value} must be signed"
        )
    if inbound.kind is protocol.MessageKind.ORIGINAL:
        if not protocol.verify_token(
            secret, inbound.token, inbound.cm_id, inbound.destination, inbound.recipient
        ):
            raise InvalidMessage("bad token: the copy's HMAC does not verify")
        return
    if not protocol.verify_control_token(
        secret,
        inbound.token,
        inbound.kind.value,
        inbound.cm_id,
        inbound.destination,
        inbound.recipient,
        body,
    ):
        raise InvalidMessage(f"bad token: the {inbound.kind.value}'s HMAC does not verify")


def check_payload(body: bytes, content_type: str | None) -> None:
    """Reject a body that does not decode as its content type says."""
    try:
        decode_payload(body, content_type)
    except ProtocolError as exc:
        raise InvalidMessage(str(exc)) from None


def judge(delivery: Delivery, secret: bytes | None) -> Inbound:
    """The condmsg facts of ``delivery``, checked in turn: its headers, its AMQP message
    id, its token and, but for a sequence part (its whole is checked once complete), its
    payload. Raises :class:`InvalidMessage` with the reason."""
    props = delivery.properties
    inbound = parse(delivery.headers, props.reply_to)
    check_message_id(props.message_id, inbound)
    check_token(inbound, secret, delivery.body)
    if inbound.seq_id is None:
        check_payload(delivery.body, props.content_type)
    return inbound


def invalid_reason(exc: Exception) -> str:
    """The invalid-queue reason for an exception raised while judging a message: what an
    :class:`InvalidMessage` says, else (a codec's bug) the exception's type and message."""
    if isinstance(exc, InvalidMessage):
        return str(exc)
    try:
        detail = str(exc)
    except Exception:  # an exception whose message itself fails
        detail = "?"
    return f"undecodable: {type(exc).__name__}: {detail}"
