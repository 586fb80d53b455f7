"""The condmsg wire protocol: copy headers, HMAC tokens, and the ack document.

A *copy* is one AMQP message per destination of a conditional message (CM). It carries the
application payload untouched and the control information in AMQP headers (see
``docs/protocol.md``). Its ``reply_to`` is the sender's ack queue (Return Address), its
``correlation_id`` the CM id, its ``message_id`` unique per copy.

An *ack* is a small JSON document a receiver publishes to that ``reply_to`` queue. It
carries back the copy's token, an HMAC over (CM id, destination, recipient) keyed by the
deployment secret, so the evaluator counts only acks for copies it actually sent.
Compensations and success notices carry a control token over their body as well.

The JSON Schemas in ``condmsg/schema/`` are the specification of the ack document and of
the headers; the checks here are hand-written for speed and held to the schemas by
``tests/unit/test_ack_schema.py``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from condmsg.core.acks import Ack, AckKind
from condmsg.core.errors import AckError, ProtocolError
from condmsg.core.limits import MAX_ACK_ID_CHARS as MAX_ACK_ID_CHARS
from condmsg.core.limits import MAX_CM_ID_CHARS as MAX_CM_ID_CHARS
from condmsg.core.limits import MAX_NAME_CHARS as MAX_NAME_CHARS
from condmsg.core.limits import MAX_SEQ_ID_CHARS as MAX_SEQ_ID_CHARS
from condmsg.core.limits import forbidden_character
from condmsg.core.timeutil import RESOLUTION, as_utc

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
#: Set on messages a receiver moves to its invalid-message queue: the queue it read them from.
H_ORIGINAL_QUEUE = "condmsg-original-queue"

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
    return _same_token(expected, token)


#: The message kinds a control token signs.
CONTROL_KINDS = frozenset({"compensation", "success"})


def control_token(
    secret: bytes, kind: str, cm_id: str, destination: str, recipient: str | None, body: bytes
) -> str:
    """HMAC-SHA256 (hex) of a compensation or success notice, keyed by the deployment secret,
    over ``kind \x1f cm_id \x1f destination \x1f recipient \x1f sha256(body)``.

    The body's digest binds the token to what the application is handed, so a captured
    token cannot carry another payload; the kind keeps a success notice's token from
    passing as a compensation's.
    """
    if not secret:
        raise ProtocolError("a deployment secret is required to sign messages (CONDMSG_SECRET)")
    if kind not in CONTROL_KINDS:
        raise ProtocolError(f"control tokens sign compensations and success notices, not {kind!r}")
    digest = hashlib.sha256(body).hexdigest()
    message = "\x1f".join((kind, cm_id, destination, recipient or "", digest)).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def verify_control_token(
    secret: bytes,
    token: str,
    kind: str,
    cm_id: str,
    destination: str,
    recipient: str | None,
    body: bytes,
) -> bool:
    """Constant-time check of the token of a compensation or success notice."""
    expected = control_token(secret, kind, cm_id, destination, recipient, body)
    return _same_token(expected, token)


def _same_token(expected: str, token: str) -> bool:
    # compare_digest refuses non-ASCII str; a token that is not ASCII is simply wrong.
    return token.isascii() and hmac.compare_digest(expected, token)


# -- timestamps on the wire -------------------------------------------------------------


def format_instant(value: datetime) -> str:
    """ISO-8601 UTC with microseconds: ``2026-11-21T22:13:41.123456Z`` (lossless)."""
    if value.tzinfo is not UTC:
        value = as_utc(value)
    return value.isoformat(timespec="microseconds").replace("+00:00", "Z")


#: Compact JSON for documents on the wire (one encoder: ``json.dumps`` with options builds
#: a new one per call).
compact_json = json.JSONEncoder(separators=(",", ":")).encode

#: An instant on the wire: RFC 3339 ``date-time`` with an explicit offset (``Z``/``z`` or
#: ``+hh:mm``/``-hh:mm``), ``T`` or ``t`` between date and time, seconds required, any
#: number of fraction digits; no leap second (``:60``: no Python datetime holds one) and no
#: year 0000. The same pattern is the schemas' (``condmsg/schema/*.json``).
INSTANT_PATTERN = (
    r"^(?!0000)[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])[Tt]"
    r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.([0-9]+))?"
    r"(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])$"
)
_INSTANT = re.compile(INSTANT_PATTERN)
#: Longest instant accepted (its fraction is unbounded in RFC 3339; 64 characters leave
#: room for more digits than any clock has).
MAX_INSTANT_CHARS = 64


def parse_instant(value: object, field: str) -> datetime:
    """An RFC 3339 instant (see :data:`INSTANT_PATTERN`) as an aware UTC datetime.

    Digits beyond microseconds round up to the next microsecond, so an instant is never
    read as earlier than it was (a deadline at ``D`` is met by ``D`` itself, not by
    ``D`` + 1 ns). Raises :class:`ProtocolError` naming ``field``.
    """
    if not isinstance(value, str):
        raise ProtocolError(f"{field} must be an RFC 3339 string, got {type(value).__name__}")
    found = _INSTANT.fullmatch(value) if len(value) <= MAX_INSTANT_CHARS else None
    if found is None:
        raise ProtocolError(
            f"{field} is not an ISO-8601 instant in RFC 3339 form with an offset "
            f"(2026-11-21T22:13:41.123456Z): {value[:40]!r}"
        )
    fraction = found.group(1)
    try:
        # The pattern admits only RFC 3339; fromisoformat (C) reads that with an upper-case
        # T and Z, and checks the calendar (2026-02-30 is refused).
        if value[10] == "t" or value[-1] == "z":
            value = value.upper()
        parsed = datetime.fromisoformat(value)
        if fraction is not None and len(fraction) > 6 and fraction[6:].strip("0"):
            parsed += RESOLUTION
        return parsed if parsed.tzinfo is UTC else as_utc(parsed)
    except (ValueError, OverflowError):
        raise ProtocolError(f"{field} is not a valid instant: {value[:40]!r}") from None


# -- the ack document -------------------------------------------------------------------

#: Longest ack body read (bytes, before parsing). A valid ack is at most about 11 KiB:
#: every name at its longest and every character escaped as a ``\\uXXXX`` pair.
MAX_ACK_BYTES = 16384
#: A token: HMAC-SHA256 as 64 lowercase hex digits.
TOKEN_PATTERN = r"^[0-9a-f]{64}$"
_TOKEN = re.compile(TOKEN_PATTERN)
#: The longest value of each text field of an ack (the columns of ``condmsg_ack``).
ACK_FIELD_CHARS = {
    "ack_id": MAX_ACK_ID_CHARS,
    "cm_id": MAX_CM_ID_CHARS,
    "destination": MAX_NAME_CHARS,
    "recipient": MAX_NAME_CHARS,
    "receiver": MAX_NAME_CHARS,
}

#: Every field of the ack document; each is required (``recipient`` and ``committed_at``
#: may be null, but present).
ACK_FIELDS = frozenset(
    {
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
)


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


_KINDS = {kind.value: kind for kind in AckKind}


def decode_ack(body: bytes | str) -> tuple[AckMessage, Ack]:
    """Decode an ack body into the document and the evaluation's view of it (checked
    once, for both); raises :class:`ProtocolError` saying what is wrong, for any input."""
    if len(body) > MAX_ACK_BYTES:
        raise ProtocolError(f"ack body is longer than {MAX_ACK_BYTES} bytes ({len(body)})")
    try:
        data = json.loads(body)
    except RecursionError:
        raise ProtocolError("ack body nests too deeply to be an ack") from None
    except (ValueError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
        raise ProtocolError(f"ack body is not JSON ({exc})") from None
    try:
        return _ack_from_dict(data)
    except ProtocolError:
        raise
    except Exception as exc:
        # A bug in the checks below must cost one ack (dead-lettered), never the intake.
        raise ProtocolError(f"ack could not be read ({type(exc).__name__}: {exc})") from exc


def _ack_from_dict(data: object) -> tuple[AckMessage, Ack]:
    if type(data) is not dict:
        raise ProtocolError("ack body must be a JSON object")
    if data.keys() != ACK_FIELDS:
        missing, unknown = sorted(ACK_FIELDS - data.keys()), sorted(data.keys() - ACK_FIELDS)
        raise ProtocolError(f"ack has missing field(s) {missing} / unknown field(s) {unknown}")
    version = data["v"]
    if type(version) is not int or version != PROTOCOL_VERSION:  # not true, not 1.0
        raise ProtocolError(f"ack field 'v' must be the integer 1, got {_show(version)}")
    recipient = data["recipient"]
    if recipient is not None:
        recipient = _text(recipient, "recipient")
    kind_raw = data["kind"]
    kind = _KINDS.get(kind_raw) if type(kind_raw) is str else None
    if kind is None:
        raise ProtocolError(f"ack field 'kind' must be 'read' or 'commit', got {_show(kind_raw)}")
    token = data["token"]
    if type(token) is not str or _TOKEN.fullmatch(token) is None:
        raise ProtocolError("ack field 'token' must be 64 lowercase hex digits")
    read_at = parse_instant(data["read_at"], "read_at")
    committed_raw = data["committed_at"]
    if kind is AckKind.COMMIT:
        if committed_raw is None:
            raise ProtocolError("ack field 'committed_at' must be an instant in a commit ack")
        committed: datetime | None = parse_instant(committed_raw, "committed_at")
    elif committed_raw is not None:
        raise ProtocolError("ack field 'committed_at' must be null in a read ack")
    else:
        committed = None
    destination = _text(data["destination"], "destination")
    try:
        # The evaluation's own invariants (committed_at not before read_at).
        ack = Ack(
            destination=destination,
            kind=kind,
            read_at=read_at,
            committed_at=committed,
            recipient=recipient,
        )
    except AckError as exc:
        raise ProtocolError(str(exc)) from None
    message = AckMessage(
        ack_id=_text(data["ack_id"], "ack_id"),
        cm_id=_text(data["cm_id"], "cm_id"),
        destination=destination,
        kind=kind,
        read_at=read_at,
        committed_at=committed,
        recipient=recipient,
        receiver=_text(data["receiver"], "receiver"),
        token=token,
    )
    return message, ack


def _text(value: object, field: str) -> str:
    """A text field of the ack: a non-empty string within its column, no control character
    (a NUL would fail every batch the ack is in: no PostgreSQL text holds one)."""
    if type(value) is not str or not value:
        raise ProtocolError(f"ack field {field!r} must be a non-empty string, got {_show(value)}")
    bad = forbidden_character(value)
    if bad is not None:
        raise ProtocolError(f"ack field {field!r} contains {bad}")
    longest = ACK_FIELD_CHARS[field]
    if len(value) > longest:
        raise ProtocolError(f"ack field {field!r} is longer than {longest} characters")
    return value


def _show(value: object) -> str:
    """A short rendering of a bad value for a reason (reasons are at most 1000 characters)."""
    if type(value) is int and value.bit_length() > 64:
        return "a large integer"  # repr() refuses ints of more than 4300 digits
    if isinstance(value, str | int | float | bool | None):
        return repr(value)[:40]
    return "a JSON object" if isinstance(value, dict) else "a JSON array"
