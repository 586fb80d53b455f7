"""The condmsg wire protocol: copy headers, HMAC tokens, and the ack document.

A *copy* is one AMQP message per destination of a conditional message (CM). It carries the
application payload untouched and the control information in AMQP headers (see
``docs/protocol.md``). Its ``reply_to`` is the sender's ack queue (Return Address), its
``correlation_id`` the CM id, its ``message_id`` unique per copy.

An *ack* is a small JSON document a receiver publishes to that ``reply_to`` queue. It
carries back the copy's token, an HMAC over (CM id, destination, recipient) keyed by the
deployment secret, so the evaluator counts only acks for copies it actually sent.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from condmsg.acks import Ack, AckKind
from condmsg.errors import AckError, ProtocolError
from condmsg.timeutil import as_utc, is_aware

PROTOCOL_VERSION = 1

# -- copy headers ---------------------------------------------------------------------
H_VERSION = "condmsg-version"
H_KIND = "condmsg-kind"
H_CM_ID = "condmsg-cm-id"
H_DESTINATION = "condmsg-destination"
H_RECIPIENT = "condmsg-recipient"
H_REQUIRES = "condmsg-requires"
H_SENDER = "condmsg-sender"
H_SENT_AT = "condmsg-sent-at"
H_TOKEN = "condmsg-token"
H_SEQ_ID = "condmsg-seq-id"
H_SEQ_POS = "condmsg-seq-pos"
H_SEQ_SIZE = "condmsg-seq-size"
#: Set on messages moved to a dead-letter / invalid-message queue: why they are there.
H_REASON = "condmsg-reason"

ACK_CONTENT_TYPE = "application/vnd.condmsg.ack+json"
ACK_TYPE = "condmsg.ack"


class MessageKind(StrEnum):
    """What a condmsg message is to the receiving application."""

    ORIGINAL = "original"
    COMPENSATION = "compensation"
    SUCCESS = "success"


class Requirement(StrEnum):
    """What the condition asks of a destination (the paper's 'processing required' flag)."""

    NONE = "none"
    PICKUP = "pickup"
    PROCESS = "process"


# -- naming -----------------------------------------------------------------------------


def ack_queue(sender: str) -> str:
    """The sender's ack queue (the paper's DS.ACK.Q)."""
    return f"condmsg.{sender}.ack"


def outcome_queue(sender: str) -> str:
    """The sender's outcome queue (DS.OUTCOME.Q)."""
    return f"condmsg.{sender}.outcome"


def dead_letter_queue(sender: str) -> str:
    """Where the evaluator puts malformed acks, with the reason in ``condmsg-reason``."""
    return f"condmsg.{sender}.dead"


#: Receivers move copies they cannot accept here, with the reason in ``condmsg-reason``.
INVALID_MESSAGE_QUEUE = "condmsg.invalid"


# -- tokens -----------------------------------------------------------------------------


def copy_token(secret: bytes, cm_id: str, destination: str, recipient: str | None) -> str:
    """HMAC-SHA256 over (CM id, destination, recipient), hex. Keyed by the deployment secret."""
    if not secret:
        raise ProtocolError("a deployment secret is required to sign copies (CONDMSG_SECRET)")
    message = "\x1f".join((cm_id, destination, recipient or "")).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def verify_token(
    secret: bytes, token: str, cm_id: str, destination: str, recipient: str | None
) -> bool:
    """Constant-time check of a token carried back by an ack."""
    expected = copy_token(secret, cm_id, destination, recipient)
    return hmac.compare_digest(expected, token)


# -- timestamps on the wire -------------------------------------------------------------


def format_instant(value: datetime) -> str:
    """ISO-8601 UTC with microseconds: ``2026-11-21T22:13:41.123456Z`` (lossless)."""
    if value.tzinfo is not UTC:
        value = as_utc(value)
    return value.isoformat(timespec="microseconds").replace("+00:00", "Z")


#: Compact JSON for documents on the wire (one encoder: ``json.dumps`` with options builds
#: a new one per call).
compact_json = json.JSONEncoder(separators=(",", ":")).encode


def parse_instant(value: object, field: str) -> datetime:
    if not isinstance(value, str):
        raise ProtocolError(f"{field} must be an ISO-8601 string, got {type(value).__name__}")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ProtocolError(f"{field} is not an ISO-8601 instant: {value[:40]!r}") from None
    if parsed.tzinfo is UTC:  # "...Z" or "+00:00": the usual case, nothing to convert
        return parsed
    if not is_aware(parsed):
        raise ProtocolError(f"{field} has no timezone (UTC required): {value[:40]!r}")
    return as_utc(parsed)


# -- the ack document -------------------------------------------------------------------

_ACK_FIELDS = {
    "v",
    "ack_id",
    "cm_id",
    "destination",
    "recipient",
    "receiver",
    "kind",
    "read_at",
    "committed_at",
    "token",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class AckMessage:
    """An ack as it travels from a receiver to the sender's ack queue.

    ``ack_id`` is unique per ack (the evaluator stores acks idempotently on it);
    ``receiver`` names the receiving process, ``recipient`` the final recipient identity.
    """

    ack_id: str
    cm_id: str
    destination: str
    kind: AckKind
    read_at: datetime
    committed_at: datetime | None
    recipient: str | None
    receiver: str
    token: str

    def to_ack(self) -> Ack:
        """The evaluation's view of this ack."""
        return Ack(
            destination=self.destination,
            kind=self.kind,
            read_at=self.read_at,
            committed_at=self.committed_at,
            recipient=self.recipient,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": PROTOCOL_VERSION,
            "ack_id": self.ack_id,
            "cm_id": self.cm_id,
            "destination": self.destination,
            "recipient": self.recipient,
            "receiver": self.receiver,
            "kind": self.kind.value,
            "read_at": format_instant(self.read_at),
            "committed_at": (
                format_instant(self.committed_at) if self.committed_at is not None else None
            ),
            "token": self.token,
        }

    def to_json(self) -> bytes:
        return compact_json(self.to_dict()).encode()

    @classmethod
    def from_json(cls, body: bytes | str) -> AckMessage:
        """Decode an ack body; raises :class:`ProtocolError` saying what is wrong."""
        return decode_ack(body)[0]

    @classmethod
    def from_dict(cls, data: object) -> AckMessage:
        return _ack_from_dict(data)[0]


_REQUIRED_TEXT = ("ack_id", "cm_id", "destination", "receiver", "token", "kind", "read_at")
_KINDS = {kind.value: kind for kind in AckKind}
#: No store can hold it (PostgreSQL's text cannot): an ack carrying one would fail every
#: batch it is in, so it is refused as malformed instead.
_NUL = "ack field {!r} contains a NUL character"


def decode_ack(body: bytes | str) -> tuple[AckMessage, Ack]:
    """Decode an ack body into the document and the evaluation's view of it (checked
    once, for both); raises :class:`ProtocolError` saying what is wrong."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"ack body is not JSON ({exc})") from None
    return _ack_from_dict(data)


def _ack_from_dict(data: object) -> tuple[AckMessage, Ack]:
    if not isinstance(data, dict):
        raise ProtocolError("ack body must be a JSON object")
    if not _ACK_FIELDS.issuperset(data):
        raise ProtocolError(f"ack has unknown field(s) {sorted(set(data) - _ACK_FIELDS)}")
    if data.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(f"ack protocol version {data.get('v')!r} is not supported")
    for name in _REQUIRED_TEXT:
        value = data.get(name)
        if not isinstance(value, str) or not value:
            raise ProtocolError(f"ack field {name!r} must be a non-empty string")
        if "\x00" in value:
            raise ProtocolError(_NUL.format(name))
    recipient = data.get("recipient")
    if recipient is not None and (not isinstance(recipient, str) or not recipient):
        raise ProtocolError("ack field 'recipient' must be a non-empty string or null")
    if recipient is not None and "\x00" in recipient:
        raise ProtocolError(_NUL.format("recipient"))
    kind = _KINDS.get(data["kind"])
    if kind is None:
        raise ProtocolError(f"ack kind must be 'read' or 'commit', got {data['kind']!r}")
    committed_raw = data.get("committed_at")
    committed = parse_instant(committed_raw, "committed_at") if committed_raw is not None else None
    read_at = parse_instant(data["read_at"], "read_at")
    try:
        # The evaluation's own invariants (kind vs. timestamps), checked by the Ack itself.
        ack = Ack(
            destination=data["destination"],
            kind=kind,
            read_at=read_at,
            committed_at=committed,
            recipient=recipient,
        )
    except AckError as exc:
        raise ProtocolError(str(exc)) from None
    message = AckMessage(
        ack_id=data["ack_id"],
        cm_id=data["cm_id"],
        destination=data["destination"],
        kind=kind,
        read_at=read_at,
        committed_at=committed,
        recipient=recipient,
        receiver=data["receiver"],
        token=data["token"],
    )
    return message, ack
