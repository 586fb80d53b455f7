"""Compensations and success notices carry a control
token over their body, and a receiver holding the secret checks every kind of message.

The recipe is recomputed here from ``docs/protocol.md`` alone (key, separator, fields,
order, hex case), as a receiver in another language would."""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ackd.validation import Inbound, InvalidMessage, check_token, parse
from condmsg.core import protocol
from condmsg.core.conditions import Destination
from condmsg.sending.copies import notice_message, plan_copies

SECRET = b"unit-test-secret-8f2a6d1c9b4e7035"
SENT_AT = datetime(2026, 11, 21, 22, 13, 41, 123456, tzinfo=UTC)


def _documented_control_token(
    key: bytes, kind: str, cm_id: str, destination: str, recipient: str, body: bytes
) -> str:
    fields = [kind, cm_id, destination, recipient, hashlib.sha256(body).hexdigest()]
    return hmac.new(key, "\x1f".join(fields).encode("utf-8"), hashlib.sha256).hexdigest()


def _notice(
    kind: protocol.MessageKind, body: bytes = b"undo", recipient: str | None = "alice"
) -> dict[str, Any]:
    message = notice_message(
        kind=kind,
        cm_id="cm-1",
        destination="qr1",
        recipient=recipient,
        sender="s",
        sent_at=SENT_AT,
        exchange="",
        routing_key="qr1",
        body=body,
        content_type="application/octet-stream",
        secret=SECRET,
    )
    return dict(message.headers or {})


@pytest.mark.parametrize("kind", [protocol.MessageKind.COMPENSATION, protocol.MessageKind.SUCCESS])
@pytest.mark.parametrize("recipient", ["alice", None])
def test_compensations_and_notices_carry_the_documented_token(
    kind: protocol.MessageKind, recipient: str | None
) -> None:
    headers = _notice(kind, recipient=recipient)
    expected = _documented_control_token(
        SECRET, kind.value, "cm-1", "qr1", recipient or "", b"undo"
    )
    assert headers[protocol.H_TOKEN] == expected
    assert protocol.control_token(SECRET, kind.value, "cm-1", "qr1", recipient, b"undo") == expected
    assert protocol.verify_control_token(
        SECRET, expected, kind.value, "cm-1", "qr1", recipient, b"undo"
    )


def test_the_token_binds_kind_body_and_names() -> None:
    token = protocol.control_token(SECRET, "compensation", "cm-1", "qr1", "alice", b"undo")
    assert not protocol.verify_control_token(
        SECRET, token, "success", "cm-1", "qr1", "alice", b"undo"
    )
    assert not protocol.verify_control_token(
        SECRET, token, "compensation", "cm-1", "qr1", "alice", b"undo!"
    )
    assert not protocol.verify_control_token(
        SECRET, token, "compensation", "cm-2", "qr1", "alice", b"undo"
    )
    assert not protocol.verify_control_token(
        SECRET, token, "compensation", "cm-1", "qr1", None, b"undo"
    )
    assert not protocol.verify_control_token(
        b"other", token, "compensation", "cm-1", "qr1", "alice", b"undo"
    )
    assert not protocol.verify_control_token(
        SECRET, "é" * 64, "compensation", "cm-1", "qr1", "alice", b"undo"
    )


def test_only_control_kinds_are_signed_with_a_control_token() -> None:
    with pytest.raises(protocol.ProtocolError):
        protocol.control_token(SECRET, "original", "cm-1", "qr1", None, b"")


def _inbound(headers: dict[str, Any]) -> Inbound:
    return parse(headers, "acks")


@pytest.mark.parametrize("kind", [protocol.MessageKind.COMPENSATION, protocol.MessageKind.SUCCESS])
def test_a_receiver_with_the_secret_checks_control_messages(kind: protocol.MessageKind) -> None:
    genuine = _inbound(_notice(kind))
    check_token(genuine, SECRET, b"undo")
    check_token(genuine, None, b"anything")  # no secret: nothing is checked
    with pytest.raises(InvalidMessage, match=f"bad token: the {kind.value}'s HMAC"):
        check_token(genuine, SECRET, b"another body")
    unsigned = _notice(kind)
    del unsigned[protocol.H_TOKEN]
    with pytest.raises(InvalidMessage, match=f"missing header condmsg-token: a {kind.value}"):
        check_token(_inbound(unsigned), SECRET, b"undo")
    check_token(_inbound(unsigned), None, b"undo")


def test_originals_and_parts_are_checked_with_their_copy_token() -> None:
    condition = Destination("qr1", pickup_within=timedelta(seconds=30))
    (plan,) = plan_copies(
        cm_id="cm-1",
        condition=condition,
        sender="s",
        sent_at=SENT_AT,
        secret=SECRET,
        body=b"x" * 10,
        content_type="application/octet-stream",
        app_headers={},
        part_bytes=4,
    )
    assert len(plan.messages) == 3
    for message in plan.messages:
        inbound = _inbound(dict(message.headers or {}))
        assert inbound.seq_id is not None
        check_token(inbound, SECRET, message.body)  # a part: the copy's token, whatever its body
        with pytest.raises(InvalidMessage, match="bad token: the copy's HMAC"):
            check_token(inbound, b"another secret", message.body)
