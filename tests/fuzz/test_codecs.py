"""Fuzzing the codecs every inbound message goes through (pure, no services).

Each codec raises only its typed error, for ANY input: ``decode_ack`` and
``decode_payload`` :class:`ProtocolError`, the condition codec :class:`ConditionError`,
``ackd.validation.parse`` :class:`InvalidMessage`. Any other exception (``RecursionError``,
``OverflowError``, ``TypeError``...) escapes the callers' handling of bad input and can
stop a service. Whatever a codec accepts satisfies the documented schema and round-trips.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ackd.validation import InvalidMessage, parse
from condmsg.core import protocol
from condmsg.core.condition_codec import condition_from_json, condition_to_dict, condition_to_json
from condmsg.core.conditions import Condition
from condmsg.core.errors import ConditionError, ProtocolError
from condmsg.core.payloads import decode_payload, encode_payload
from tests.unit.strategies import conditions

from . import strategies as s
from .conftest import DEEP, UNIT

pytestmark = [pytest.mark.fuzz]


# -- the ack document -------------------------------------------------------------------


def decode_or_refuse(body: bytes) -> protocol.AckMessage | None:
    """The decoded ack, or None if refused with a :class:`ProtocolError` (anything else
    raised fails the test)."""
    try:
        message, _ack = protocol.decode_ack(body)
    except ProtocolError as exc:
        reason = str(exc)
    else:
        return message
    assert reason, "a refusal names what is wrong"
    return None


def assert_ack_schema(body: bytes, message: protocol.AckMessage) -> None:
    """What an accepted ack must satisfy (docs/protocol.md): integer version 1, every
    text field within its length and free of NUL, a body within the size limit."""
    assert len(body) <= s.ACK_BODY_MAX, f"accepted an ack body of {len(body)} bytes"
    doc = json.loads(body)
    assert type(doc["v"]) is int and doc["v"] == protocol.PROTOCOL_VERSION, (
        f"accepted v={doc['v']!r}"
    )
    for field, longest in s.ACK_TEXT_MAX.items():
        value = getattr(message, field)
        if value is None:
            continue
        assert len(value) <= longest, f"accepted {field} of {len(value)} characters"
        assert "\x00" not in value, f"accepted a NUL in {field}"
    assert message.read_at.tzinfo is not None
    # It round-trips: what the evaluator stores is what was sent.
    assert protocol.decode_ack(message.to_json())[0] == message


@UNIT
@given(doc=s.valid_ack_docs())
def test_valid_acks_decode_and_round_trip(doc: dict[str, Any]) -> None:
    body = s.dumps(doc)
    message = decode_or_refuse(body)
    assert message is not None, f"refused a valid ack: {body!r}"
    assert message.to_dict() == doc
    assert_ack_schema(body, message)


@UNIT
@given(body=st.one_of(s.random_bytes(), s.valid_ack_docs().map(s.dumps).flatmap(s.truncations)))
def test_garbage_and_truncated_acks_are_refused_with_protocol_error(body: bytes) -> None:
    message = decode_or_refuse(body)
    if message is not None:  # a truncation can still be a (different) valid document
        assert_ack_schema(body, message)


@UNIT
@given(doc=s.mutated_ack_docs())
@example(doc={**s.BASE_ACK, "v": True})
@example(doc={**s.BASE_ACK, "v": 1.0})
@example(doc={**s.BASE_ACK, "v": 2})
@example(doc={**s.BASE_ACK, "ack_id": "a" * 65})
@example(doc={**s.BASE_ACK, "cm_id": "c" * 37})
@example(doc={**s.BASE_ACK, "destination": "d" * 256})
@example(doc={**s.BASE_ACK, "read_at": "0001-01-01T00:00:00+05:00"})
@example(doc={**s.BASE_ACK, "read_at": "9999-12-31T23:59:59-05:00"})
@example(doc={**s.BASE_ACK, "read_at": float("nan")})
def test_mutated_acks_are_refused_or_satisfy_the_schema(doc: dict[str, Any]) -> None:
    body = s.dumps(doc)
    message = decode_or_refuse(body)
    if message is not None:
        assert_ack_schema(body, message)


@DEEP
@given(body=s.deep_ack_bodies())
@example(body=b"[" * 100_000)
@example(body=b'{"v":1,"ack_id":' + b"[" * 5_000 + b"]" * 5_000 + b"}")
def test_deeply_nested_acks_are_refused_with_protocol_error(body: bytes) -> None:
    assert decode_or_refuse(body) is None


@UNIT
@given(body=s.huge_ack_bodies())
def test_acks_over_the_size_limit_are_refused_with_protocol_error(body: bytes) -> None:
    assert decode_or_refuse(body) is None


# -- copy headers at the receiver ---------------------------------------------------------


def parse_or_refuse(headers: dict[str, Any], reply_to: str | None) -> Any:
    try:
        return parse(headers, reply_to)
    except InvalidMessage as exc:
        reason = str(exc)
    assert reason, "a refusal names what is wrong"
    return None


@UNIT
@given(headers=s.valid_headers(), reply_to=s.names())
def test_valid_headers_parse(headers: dict[str, Any], reply_to: str) -> None:
    inbound = parse_or_refuse(headers, reply_to)
    assert inbound is not None, f"refused valid headers {headers!r}"
    assert inbound.kind.value == headers[protocol.H_KIND]
    assert inbound.cm_id == headers[protocol.H_CM_ID]
    assert inbound.destination == headers[protocol.H_DESTINATION]
    assert inbound.recipient == headers.get(protocol.H_RECIPIENT)
    assert inbound.seq_pos == headers.get(protocol.H_SEQ_POS)


@UNIT
@given(
    headers=s.mutated_headers(),
    reply_to=st.one_of(st.none(), s.names(), s.control_text()),
)
@example(headers={**s.BASE_HEADERS, protocol.H_VERSION: True}, reply_to="acks")
@example(headers={**s.BASE_HEADERS, protocol.H_VERSION: 1.0}, reply_to="acks")
@example(
    headers={**s.BASE_HEADERS, protocol.H_SENT_AT: "0001-01-01T00:00:00+05:00"},
    reply_to="acks",
)
@example(headers={**s.BASE_HEADERS, protocol.H_DESTINATION: "d\x00"}, reply_to="acks")
def test_mutated_headers_are_refused_with_invalid_message_or_satisfy_the_schema(
    headers: dict[str, Any], reply_to: str | None
) -> None:
    inbound = parse_or_refuse(headers, reply_to)
    if inbound is None:
        return
    if protocol.H_VERSION not in headers:
        assert inbound.kind is None  # a plain message: passes through unread
        return
    version = headers[protocol.H_VERSION]
    assert type(version) is int and version == protocol.PROTOCOL_VERSION, f"accepted {version!r}"
    for name, longest in s.HEADER_TEXT_MAX.items():
        value = headers.get(name)
        if isinstance(value, str):
            assert len(value) <= longest and "\x00" not in value, (name, value)
    assert inbound.sent_at is not None and inbound.sent_at.tzinfo is not None


@UNIT
@given(headers=st.dictionaries(st.sampled_from(s.HEADERS), s.header_junk(), max_size=11))
def test_headers_of_junk_are_refused_with_invalid_message(headers: dict[str, Any]) -> None:
    parse_or_refuse(headers, "acks")


# -- payloads -------------------------------------------------------------------------------

JSON_TYPES = st.sampled_from(["application/json", "application/vnd.x+json; charset=utf-8"])
CONTENT_TYPES = st.one_of(
    JSON_TYPES,
    st.sampled_from(["text/plain; charset=utf-8", "text/csv", None, "application/octet-stream"]),
    st.text(max_size=30),
)


def decode_payload_or_refuse(body: bytes, content_type: str | None) -> None:
    try:
        decode_payload(body, content_type)
    except ProtocolError as exc:
        reason = str(exc)
    else:
        return
    assert reason, "a refusal names what is wrong"


@UNIT
@given(
    value=st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)  # JSON has neither
        | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=20,
    )
)
def test_json_payloads_round_trip(value: Any) -> None:
    body, content_type = encode_payload(value)
    assert decode_payload(body, content_type) == value


@UNIT
@given(body=s.random_bytes(), content_type=CONTENT_TYPES)
def test_garbage_payloads_are_refused_with_protocol_error(
    body: bytes, content_type: str | None
) -> None:
    decode_payload_or_refuse(body, content_type)


@DEEP
@given(depth=st.one_of(s.DEEP, s.NEAR_LIMIT), kind=st.sampled_from(["[", "{"]), ct=JSON_TYPES)
@example(depth=100_000, kind="[", ct="application/json")
def test_deeply_nested_json_payloads_are_refused_with_protocol_error(
    depth: int, kind: str, ct: str
) -> None:
    decode_payload_or_refuse(s.deep_json_text(depth, kind=kind).encode(), ct)


# -- condition documents --------------------------------------------------------------------


def condition_or_refuse(document: str | bytes) -> Condition | None:
    try:
        return condition_from_json(document)
    except ConditionError as exc:
        reason = str(exc)
    assert reason, "a refusal names what is wrong"
    return None


def assert_condition_schema(condition: Condition) -> None:
    """What an accepted condition must satisfy: names within length and free of control
    characters, and it round-trips through its own document."""
    for _, node in condition.walk():
        for attr in ("name", "recipient", "exchange", "routing_key"):
            value = getattr(node, attr, None)
            if value is not None:
                assert len(value) <= s.NAME_MAX, f"accepted a {attr} of {len(value)} characters"
                assert "\x00" not in value, f"accepted a NUL in {attr}"
    assert condition_from_json(condition_to_json(condition)) == condition


@UNIT
@given(condition=conditions(broker_properties=True))
def test_valid_conditions_round_trip(condition: Condition) -> None:
    document = condition_to_json(condition)
    decoded = condition_or_refuse(document)
    assert decoded == condition, document
    assert_condition_schema(decoded)


@UNIT
@given(data=st.data(), condition=conditions(broker_properties=True))
def test_mutated_conditions_are_refused_or_valid(data: st.DataObject, condition: Condition) -> None:
    doc = data.draw(s.mutated_condition_docs(condition_to_dict(condition)))
    decoded = condition_or_refuse(s.dumps(doc))
    if decoded is not None:
        assert_condition_schema(decoded)


@UNIT
@given(
    body=st.one_of(
        s.random_bytes(),
        conditions().map(condition_to_json).map(str.encode).flatmap(s.truncations),
        st.lists(s.junk_values(), max_size=3).map(s.dumps),
    )
)
def test_garbage_and_truncated_conditions_are_refused_with_condition_error(body: bytes) -> None:
    decoded = condition_or_refuse(body)
    if decoded is not None:
        assert_condition_schema(decoded)


@DEEP
@given(depth=s.DEEP)
@example(depth=5_000)
def test_deeply_nested_conditions_are_refused_with_condition_error(depth: int) -> None:
    """A thousand levels is beyond any depth bound (docs/conditions.md)."""
    assert condition_or_refuse(s.deep_condition_text(depth)) is None


@DEEP
@given(depth=s.NEAR_LIMIT)
@example(depth=400)
def test_conditions_nested_near_the_recursion_limit_raise_only_condition_error(
    depth: int,
) -> None:
    decoded = condition_or_refuse(s.deep_condition_text(depth))
    if decoded is not None:
        assert_condition_schema(decoded)


@UNIT
@given(
    field=st.sampled_from(["pickup_within_ms", "process_within_ms", "evaluation_timeout_ms"]),
    value=st.sampled_from([10**30, 2**63, 2**64, 10**18]),
)
def test_huge_durations_are_refused_with_condition_error(field: str, value: int) -> None:
    doc = {"schema": 1, "condition": {"type": "destination", "name": "q", field: value}}
    if field != "pickup_within_ms":
        doc["condition"]["pickup_within_ms"] = 1000
    assert condition_or_refuse(json.dumps(doc)) is None


@UNIT
@given(
    name=st.one_of(
        st.builds(lambda a, b: a + "\x00" + b, st.text(max_size=20), st.text(max_size=20)),
        st.text(min_size=s.NAME_MAX + 1, max_size=1000),
    )
)
@example(name="q\x00")
def test_names_with_a_nul_or_over_long_are_refused(name: str) -> None:
    doc = {
        "schema": 1,
        "condition": {"type": "destination", "name": name, "pickup_within_ms": 1000},
    }
    assert condition_or_refuse(json.dumps(doc)) is None
