"""Every codec raises only its typed error, for any input, with a reason naming the field; the
documented limits hold, and they are the store's columns."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ackd import tables as receiver_tables
from ackd.validation import InvalidMessage, parse
from condmsg import tables
from condmsg.core import protocol
from condmsg.core.condition_codec import MAX_DOCUMENT_BYTES, condition_from_json
from condmsg.core.conditions import MAX_DEPTH, MAX_NODES, Destination, DestinationSet
from condmsg.core.errors import ConditionError, ProtocolError
from condmsg.core.payloads import decode_payload

DEEP = 100_000  # far past the interpreter's recursion limit


def _ack(**changes: Any) -> dict[str, Any]:
    document = {
        "v": 1,
        "ack_id": "a" * 32,
        "cm_id": "c" * 36,
        "destination": "qr1",
        "recipient": "alice",
        "receiver": "host:1:alice",
        "kind": "commit",
        "read_at": "2026-11-21T22:13:41.123456Z",
        "committed_at": "2026-11-21T22:13:41.987654Z",
        "token": "ab" * 32,
    }
    document.update(changes)
    return {k: v for k, v in document.items() if v is not ...}


def _refused(document: object, reason: str) -> None:
    body = document if isinstance(document, bytes) else json.dumps(document).encode()
    with pytest.raises(ProtocolError, match=reason):
        protocol.decode_ack(body)


# -- the ack document ----------------------------------------------------------------------


def test_a_genuine_ack_decodes_and_its_rendering_is_unchanged() -> None:
    message, ack = protocol.decode_ack(json.dumps(_ack()))
    assert message.to_dict() == _ack()
    assert ack.committed_at == datetime(2026, 11, 21, 22, 13, 41, 987654, tzinfo=UTC)


@pytest.mark.parametrize(
    "body",
    [b"[" * DEEP, b'{"v":' + b"[" * DEEP + b"]" * DEEP + b"}", b'{"a":' * DEEP],
)
def test_a_deeply_nested_ack_body_is_a_protocol_error(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        protocol.decode_ack(body)


def test_an_ack_body_over_the_limit_is_refused_before_parsing() -> None:
    padded = json.dumps(_ack()).replace(",", "," + " " * protocol.MAX_ACK_BYTES, 1)
    _refused(padded.encode(), f"longer than {protocol.MAX_ACK_BYTES} bytes")


def test_the_longest_valid_ack_fits_the_body_limit() -> None:
    wide = "\U0001f600" * protocol.MAX_NAME_CHARS  # escaped as a surrogate pair: 12 bytes each
    document = _ack(
        ack_id="\U0001f600" * protocol.MAX_ACK_ID_CHARS,
        cm_id="\U0001f600" * protocol.MAX_CM_ID_CHARS,
        destination=wide,
        recipient=wide,
        receiver=wide,
    )
    body = protocol.compact_json(document).encode()
    assert len(body) <= protocol.MAX_ACK_BYTES
    protocol.decode_ack(body)


@pytest.mark.parametrize(("value", "shown"), [(True, "True"), (1.0, "1.0"), ("1", "'1'")])
def test_the_version_is_the_integer_1(value: object, shown: str) -> None:
    _refused(_ack(v=value), f"'v' must be the integer 1, got {shown}")


@pytest.mark.parametrize("field", ["recipient", "committed_at", "token", "v"])
def test_every_field_is_required(field: str) -> None:
    _refused(_ack(**{field: ...}), f"missing field\\(s\\) \\['{field}'\\]")


def test_committed_at_is_null_in_a_read_ack_and_an_instant_in_a_commit_ack() -> None:
    _refused(_ack(kind="read"), "'committed_at' must be null in a read ack")
    _refused(_ack(committed_at=None), "'committed_at' must be an instant in a commit ack")


@pytest.mark.parametrize(
    ("field", "longest"),
    [("ack_id", 64), ("cm_id", 36), ("destination", 255), ("recipient", 255), ("receiver", 255)],
)
def test_over_long_ack_fields_are_refused_naming_the_field(field: str, longest: int) -> None:
    protocol.decode_ack(json.dumps(_ack(**{field: "x" * longest})))
    _refused(_ack(**{field: "x" * (longest + 1)}), f"'{field}' is longer than {longest}")


@pytest.mark.parametrize("char", ["\x00", "\x01", "\x1f", "\n", "\ud800"])
@pytest.mark.parametrize("field", ["ack_id", "cm_id", "destination", "recipient", "receiver"])
def test_control_characters_in_ack_names_are_refused(field: str, char: str) -> None:
    _refused(_ack(**{field: f"a{char}b"}), f"'{field}' contains")


@pytest.mark.parametrize(
    "token", ["AB" * 32, "ab" * 31, "ab" * 33, "zz" * 32, "ab" * 31 + "a\n", 7, None]
)
def test_the_token_is_64_lowercase_hex_digits(token: object) -> None:
    _refused(_ack(token=token), "'token' must be 64 lowercase hex digits")


@pytest.mark.parametrize("kind", [[], {}, None, 1, "READ"])
def test_a_kind_of_any_other_value_is_refused(kind: object) -> None:
    _refused(_ack(kind=kind), "'kind' must be 'read' or 'commit'")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-21T22:13:41Z", datetime(2026, 11, 21, 22, 13, 41, tzinfo=UTC)),
        ("2026-11-21t22:13:41.5z", datetime(2026, 11, 21, 22, 13, 41, 500000, tzinfo=UTC)),
        ("2026-11-21T23:13:41+01:00", datetime(2026, 11, 21, 22, 13, 41, tzinfo=UTC)),
        ("2026-11-21T22:13:41-00:00", datetime(2026, 11, 21, 22, 13, 41, tzinfo=UTC)),
        # Beyond microseconds: rounded up, never read as earlier than it was.
        ("2026-11-21T22:13:41.1234561Z", datetime(2026, 11, 21, 22, 13, 41, 123457, tzinfo=UTC)),
        ("2026-11-21T22:13:41.123456000Z", datetime(2026, 11, 21, 22, 13, 41, 123456, tzinfo=UTC)),
        ("2026-12-31T23:59:59.9999999Z", datetime(2027, 1, 1, tzinfo=UTC)),
    ],
)
def test_rfc_3339_instants(text: str, expected: datetime) -> None:
    parsed = protocol.parse_instant(text, "read_at")
    assert parsed == expected
    assert parsed.tzinfo is UTC


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-21 22:13:41Z",  # a space (fromisoformat takes it)
        "2026-11-21T22:13:41",  # no offset
        "2026-11-21T22:13Z",  # no seconds
        "2026-11-21T22Z",
        "2026-W47-6T22:13:41Z",  # a week date
        "2026-325T22:13:41Z",  # an ordinal date
        "20261121T221341Z",  # the basic format
        "2026-11-21T22:13:41+0100",
        "2026-11-21T22:13:41+01",
        "2026-11-21T22:13:41.Z",
        "2026-11-21T22:13:60Z",  # a leap second: no datetime holds one
        "2026-02-29T22:13:41Z",  # not a leap year
        "0000-01-01T00:00:00Z",
        "0001-01-01T00:00:00+01:00",  # before year 1 in UTC
        "9999-12-31T23:59:59-01:00",  # after year 9999 in UTC
        "2026-11-21T22:13:41Z\n",
        "\uff12\uff10\uff12\uff16-11-21T22:13:41Z",  # full-width digits
        "2026-11-21T22:13:41." + "1" * 60 + "Z",  # over 64 characters
    ],
)
def test_what_fromisoformat_takes_beyond_rfc_3339_is_refused(text: str) -> None:
    with pytest.raises(ProtocolError, match="read_at"):
        protocol.parse_instant(text, "read_at")


def test_format_instant_is_unchanged() -> None:
    at = datetime(2026, 11, 21, 22, 13, 41, 123456, tzinfo=UTC)
    assert protocol.format_instant(at) == "2026-11-21T22:13:41.123456Z"
    assert protocol.parse_instant(protocol.format_instant(at), "x") == at


def test_the_limits_are_the_store_columns() -> None:
    acks = tables.acks.c
    assert acks.ack_id.type.length == protocol.MAX_ACK_ID_CHARS
    assert acks.cm_id.type.length == protocol.MAX_CM_ID_CHARS
    for column in (acks.destination, acks.recipient, acks.receiver):
        assert column.type.length == protocol.MAX_NAME_CHARS
    rlog = receiver_tables.rlog.c
    assert rlog.cm_id.type.length == protocol.MAX_CM_ID_CHARS
    for column in (rlog.destination, rlog.recipient, rlog.receiver, rlog.sender):
        assert column.type.length == protocol.MAX_NAME_CHARS
    assert receiver_tables.sequence_parts.c.seq_id.type.length == protocol.MAX_SEQ_ID_CHARS
    copies = tables.copies.c
    for column in (copies.destination, copies.recipient, copies.exchange, copies.routing_key):
        assert column.type.length == protocol.MAX_NAME_CHARS


# -- inbound headers -----------------------------------------------------------------------


def _headers(**changes: Any) -> dict[str, Any]:
    headers = {
        protocol.H_VERSION: 1,
        protocol.H_KIND: "original",
        protocol.H_CM_ID: "c" * 36,
        protocol.H_DESTINATION: "qr1",
        protocol.H_SENDER: "s",
        protocol.H_SENT_AT: "2026-11-21T22:13:41.123456Z",
        protocol.H_TOKEN: "ab" * 32,
    }
    headers.update(changes)
    return {k: v for k, v in headers.items() if v is not ...}


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({protocol.H_VERSION: True}, "unsupported condmsg-version True"),
        ({protocol.H_VERSION: 1.0}, "unsupported condmsg-version 1.0"),
        ({protocol.H_VERSION: 10**400}, "unsupported condmsg-version a large integer"),
        ({protocol.H_CM_ID: b"\xff\xfe"}, "not UTF-8"),
        ({protocol.H_CM_ID: {"nested": {"table": 1}}}, "condmsg-cm-id must be a non-empty string"),
        ({protocol.H_CM_ID: ["x"]}, "condmsg-cm-id must be a non-empty string"),
        ({protocol.H_RECIPIENT: None}, "condmsg-recipient must be a non-empty string"),
        ({protocol.H_DESTINATION: "q\x1f"}, "control character"),
        ({protocol.H_SENDER: "s" * 256}, "condmsg-sender is longer than 255"),
        ({protocol.H_SENT_AT: "2026-11-21 22:13:41Z"}, "RFC 3339"),
        ({protocol.H_TOKEN: "AB" * 32}, "64-digit hex"),
        ({protocol.H_REQUIRES: "maybe"}, "unknown condmsg-requires"),
        (
            {protocol.H_SEQ_ID: "s", protocol.H_SEQ_POS: 0, protocol.H_SEQ_SIZE: 10**30},
            "sequence position 0 of size a large integer",
        ),
        (
            {protocol.H_SEQ_ID: "s", protocol.H_SEQ_POS: 0.0, protocol.H_SEQ_SIZE: 2},
            "must be an integer",
        ),
        (
            {
                protocol.H_KIND: "compensation",
                protocol.H_SEQ_ID: "s",
                protocol.H_SEQ_POS: 0,
                protocol.H_SEQ_SIZE: 2,
            },
            "never split",
        ),
    ],
)
def test_parse_raises_only_invalid_message_naming_the_header(
    changes: dict[str, Any], reason: str
) -> None:
    with pytest.raises(InvalidMessage, match=reason):
        parse(_headers(**changes), "acks")


def test_parse_refuses_a_headers_value_that_is_not_a_table() -> None:
    with pytest.raises(InvalidMessage):
        parse(["condmsg-version"], "acks")  # type: ignore[arg-type]


# -- payloads ------------------------------------------------------------------------------


def test_a_deeply_nested_json_payload_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="nests too deeply"):
        decode_payload(b"[" * DEEP, "application/json")


# -- condition documents -------------------------------------------------------------------


def _document(node: dict[str, Any]) -> str:
    return json.dumps({"schema": 1, "condition": node})


def _nested(levels: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "destination", "name": "q", "pickup_within_ms": 1000}
    for _ in range(levels - 1):
        node = {"type": "set", "members": [node]}
    return node


@pytest.mark.parametrize("value", [10**30, -(10**30), 10**400])
def test_a_huge_duration_is_a_condition_error_naming_the_field(value: int) -> None:
    node = {"type": "destination", "name": "q", "pickup_within_ms": value}
    with pytest.raises(ConditionError, match="root: pickup_within_ms"):
        condition_from_json(_document(node))


def test_durations_up_to_the_limit_are_accepted() -> None:
    longest = 36525 * 86_400_000
    node = {"type": "destination", "name": "q", "pickup_within_ms": longest}
    condition_from_json(_document(node))
    node["pickup_within_ms"] = longest + 1
    with pytest.raises(ConditionError, match="at most"):
        condition_from_json(_document(node))
    with pytest.raises(ConditionError, match="pickup_within must be at most 36525 days"):
        Destination("q", pickup_within=timedelta(days=36526))


def test_depth_is_bounded_and_checked_while_descending() -> None:
    condition_from_json(_document(_nested(MAX_DEPTH)))
    with pytest.raises(ConditionError, match=f"deeper than {MAX_DEPTH} levels"):
        condition_from_json(_document(_nested(MAX_DEPTH + 1)))
    with pytest.raises(ConditionError, match=f"deeper than {MAX_DEPTH} levels"):
        condition_from_json(_document(_nested(200)))


@pytest.mark.parametrize(
    "document",
    [
        '{"schema":1,"condition":' + "[" * DEEP + "]" * DEEP + "}",
        '{"schema":1,"condition":' + '{"type":"set","members":[' * DEEP,
    ],
)
def test_json_nested_past_the_recursion_limit_is_a_condition_error(document: str) -> None:
    with pytest.raises(ConditionError):
        condition_from_json(document)


def test_a_condition_built_in_python_is_held_to_the_same_depth() -> None:
    node: Any = Destination("q", pickup_within=timedelta(seconds=1))
    for _ in range(MAX_DEPTH - 1):
        node = DestinationSet(node)
    with pytest.raises(ConditionError, match=f"deeper than {MAX_DEPTH} levels"):
        DestinationSet(node)


def test_the_number_of_nodes_is_bounded() -> None:
    members = [{"type": "destination", "name": f"q{i}"} for i in range(MAX_NODES)]
    node = {"type": "set", "pickup_within_ms": 1000, "members": members}
    with pytest.raises(ConditionError, match=f"more than {MAX_NODES}"):
        condition_from_json(_document(node))
    node["members"] = members[: MAX_NODES - 1]
    assert len(condition_from_json(_document(node)).destinations()) == MAX_NODES - 1


def test_a_document_over_the_size_limit_is_refused_before_parsing() -> None:
    with pytest.raises(ConditionError, match=f"longer than {MAX_DOCUMENT_BYTES} bytes"):
        condition_from_json(" " * (MAX_DOCUMENT_BYTES + 1))


@pytest.mark.parametrize("attribute", ["name", "recipient", "exchange", "routing_key"])
@pytest.mark.parametrize("char", ["\x00", "\x07", "\x1f", "\ud800"])
def test_names_with_control_characters_are_refused_in_documents(attribute: str, char: str) -> None:
    node = {"type": "destination", "name": "q", "exchange": "x", "pickup_within_ms": 1}
    node[attribute] = f"a{char}b"
    with pytest.raises(ConditionError, match=f"root .*{attribute} contains"):
        condition_from_json(_document(node))


@pytest.mark.parametrize("attribute", ["recipient", "exchange", "routing_key"])
def test_over_long_names_are_refused_in_documents(attribute: str) -> None:
    node = {"type": "destination", "name": "q", "exchange": "x", "pickup_within_ms": 1}
    node[attribute] = "x" * 256
    with pytest.raises(ConditionError, match=f"{attribute} is longer than 255"):
        condition_from_json(_document(node))


def test_a_nul_in_a_name_fails_at_construction_naming_the_field() -> None:
    with pytest.raises(ConditionError, match="name contains a NUL character"):
        Destination("q\x00", pickup_within=timedelta(seconds=1))
    with pytest.raises(ConditionError, match="recipient contains a NUL character"):
        Destination("q", recipient="r\x00", pickup_within=timedelta(seconds=1))
    with pytest.raises(ConditionError, match="name contains an unpaired surrogate"):
        Destination("q\ud800", pickup_within=timedelta(seconds=1))


def test_a_huge_count_is_refused() -> None:
    node = {
        "type": "destination",
        "name": "q",
        "exchange": "x",
        "pickup_within_ms": 1,
        "min_pickup": 2**31,
    }
    with pytest.raises(ConditionError, match="min_pickup must be at most"):
        condition_from_json(_document(node))


@pytest.mark.parametrize("document", [b"\xff\xfe", b"", b"null", b"[]", b"1e999", 7])
def test_anything_else_is_a_condition_error(document: Any) -> None:
    with pytest.raises(ConditionError):
        condition_from_json(document)
