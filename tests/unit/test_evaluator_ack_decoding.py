"""The evaluator's decoding of ack bodies: it never raises (any failure dead-letters that
body alone), each ack field has a limit, and a dead letter's reason is cut and holds no
NUL."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from condmsg import tables
from condmsg.core import protocol
from condmsg.core.acks import AckKind
from evaluator import intake

SECRET = b"unit-secret-3e9c7a1f5d2b8064a9c1"


T0 = datetime(2024, 1, 1, tzinfo=UTC)


def _ack(**overrides: Any) -> bytes:
    fields: dict[str, Any] = {
        "ack_id": uuid.uuid4().hex,
        "cm_id": str(uuid.uuid4()),
        "destination": "q",
        "kind": AckKind.READ,
        "read_at": T0,
        "committed_at": None,
        "recipient": None,
        "receiver": "rx",
        "token": "0" * 64,
    }
    return protocol.AckMessage(**(fields | overrides)).to_json()


def test_any_exception_while_decoding_dead_letters_that_body_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    good = _ack()
    decode_ack = protocol.decode_ack

    def buggy(body: bytes | str) -> Any:
        if body == b"boom":
            raise RuntimeError("a codec bug")
        return decode_ack(body)

    monkeypatch.setattr(protocol, "decode_ack", buggy)
    nested = b"[" * 100_000 + b"]" * 100_000
    decoded = intake.decode([b"boom", good, nested], sender="s", secret=SECRET)
    assert [r.message.to_json() for r in decoded.received] == [good]
    reasons = [m.headers[protocol.H_REASON] for m in decoded.dead if m.headers is not None]
    assert reasons[0] == "undecodable: RuntimeError: a codec bug"
    assert reasons[1]  # the codec's words, or "undecodable: RecursionError: ..."
    assert [m.body for m in decoded.dead] == [b"boom", nested]
    assert {m.routing_key for m in decoded.dead} == {protocol.dead_letter_queue("s")}


@pytest.mark.parametrize("name", ["ack_id", "cm_id", "destination", "recipient", "receiver"])
def test_a_field_at_its_limit_passes_one_past_it_is_dead(name: str) -> None:
    # The codec's limits are the ack table's columns (tests/unit/test_codec_limits.py).
    limit = tables.acks.c[name].type.length
    at_limit = intake.decode([_ack(**{name: "x" * limit})], sender="s", secret=SECRET)
    assert len(at_limit.received) == 1 and not at_limit.dead
    over = intake.decode([_ack(**{name: "x" * (limit + 1)})], sender="s", secret=SECRET)
    (dead,) = over.dead
    assert dead.headers is not None
    assert (
        dead.headers[protocol.H_REASON] == f"ack field {name!r} is longer than {limit} characters"
    )


def test_a_dead_letter_reason_is_cut_and_holds_no_nul() -> None:
    message = intake.dead_letter(b"body", "s", "a\x00b" + "c" * 2000)
    assert message.headers is not None
    reason = message.headers[protocol.H_REASON]
    assert isinstance(reason, str)
    assert len(reason) == intake.MAX_REASON and reason.startswith("a\\x00bc")
    assert message.body == b"body"
