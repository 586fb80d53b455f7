"""The JSON Schemas in ``condmsg/schema/`` are the specification; the hand-written validators
(``condmsg.core.protocol.decode_ack``, ``ackd.validation.parse``) must accept exactly what they
accept, plus the few rules each schema's description names because JSON Schema cannot
state them (an order between two fields, the UTC range, unpaired surrogates, ``1`` vs
``1.0``). Checked on generated valid documents and on mutations of them.

Numbers are handed to the schema validator with floats as ``Decimal``: JSON Schema's data
model reads ``1.0`` as the integer 1, the wire rule is the literal ``1``, and a Decimal is
a number that is not an integer to ``jsonschema``.
"""

from __future__ import annotations

import json
import os
import string
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from importlib import resources
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ackd.validation import InvalidMessage, parse
from condmsg.core import protocol
from condmsg.core.errors import ProtocolError

EXAMPLES = int(os.environ.get("CONDMSG_FUZZ_EXAMPLES", "300"))
_SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((resources.files("condmsg") / "schema" / name).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


ACK_SCHEMA = _validator("ack.schema.json")
HEADERS_SCHEMA = _validator("headers.schema.json")


# -- generated values ---------------------------------------------------------------------

#: Characters a name may hold (no C0 control, no surrogate), a few multi-byte ones among them.
_NAME_CHARS = st.characters(blacklist_categories=("Cs",), min_codepoint=0x20)
#: What a mutation inserts: controls, a lone surrogate, the instants' letters and digits.
_MUTATION_CHARS = st.sampled_from(
    ["\x00", "\x1f", "\n", "\ud800", " ", "t", "T", "z", "Z", "+", "-", ":", ".", "0", "9", "é"]
)


def _names(longest: int) -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(_NAME_CHARS, min_size=1, max_size=12),
        st.text(_NAME_CHARS, min_size=longest - 1, max_size=longest + 1),
    )


_OFFSETS = st.sampled_from(
    [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=8))]
)


@st.composite
def _instants(draw: st.DrawFn, at: datetime | None = None) -> tuple[datetime, str]:
    """An instant and an RFC 3339 rendering of it (exact: no digit of it is dropped)."""
    if at is None:
        at = draw(st.datetimes(datetime(1990, 1, 1), datetime(2100, 1, 1), timezones=_OFFSETS))
    text = at.strftime("%Y-%m-%d") + draw(st.sampled_from("Tt")) + at.strftime("%H:%M:%S")
    if at.microsecond or draw(st.booleans()):
        text += "." + f"{at.microsecond:06d}" + "0" * draw(st.integers(0, 3))
    offset = at.utcoffset()
    assert offset is not None
    if offset == timedelta(0) and draw(st.booleans()):
        text += draw(st.sampled_from("Zz"))
    else:
        minutes = int(offset.total_seconds()) // 60
        sign = "-" if minutes < 0 else "+"
        text += f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
    return at, text


@st.composite
def valid_acks(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["read", "commit"]))
    read_at, read_text = draw(_instants())
    committed = None
    if kind == "commit":
        later = read_at + draw(st.timedeltas(timedelta(0), timedelta(hours=1)))
        committed = draw(_instants(later))[1]
    return {
        "v": 1,
        "ack_id": draw(st.text(_NAME_CHARS, min_size=1, max_size=64)),
        "cm_id": draw(st.text(_NAME_CHARS, min_size=1, max_size=36)),
        "destination": draw(st.text(_NAME_CHARS, min_size=1, max_size=255)),
        "recipient": draw(st.none() | st.text(_NAME_CHARS, min_size=1, max_size=255)),
        "receiver": draw(st.text(_NAME_CHARS, min_size=1, max_size=255)),
        "kind": kind,
        "read_at": read_text,
        "committed_at": committed,
        "token": draw(st.text("0123456789abcdef", min_size=64, max_size=64)),
    }


_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([1, 1.0, 0, 2, -1, 2**31, 2**31 - 1, "1", True, False])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


#: Values one step from a valid one: the wrong type of the right value, an empty string,
#: a bound plus one, another field's valid value.
_NEAR_MISSES = [
    True,
    False,
    1.0,
    1,
    "1",
    2,
    0,
    -1,
    2**31,
    2**64,
    None,
    "",
    [],
    {},
    "x" * 37,
    "x" * 65,
    "x" * 256,
    "ab" * 32,
    "AB" * 32,
    "ab" * 31,
    "2026-11-21T22:13:41Z",
    "2026-11-21 22:13:41Z",
    "2026-11-21T22:13:41",
    "read",
    "commit",
    "original",
    "compensation",
    "success",
    "none",
    "process",
    "q\x00",
    "q\x1f",
    "\ud800",
]


@st.composite
def _mutated(draw: st.DrawFn, document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with one to three mutations: a field dropped, added or replaced by any
    JSON value, or a character of a string inserted, replaced or removed."""
    out = dict(document)
    for _ in range(draw(st.integers(1, 3))):
        keys = sorted(out)
        how = draw(st.sampled_from(["drop", "add", "value", "near", "char", "char", "grow"]))
        if how == "add" or not keys:
            out[draw(st.sampled_from(["extra", "condmsg-extra", *keys]))] = draw(_JSON_VALUES)
            continue
        key = draw(st.sampled_from(keys))
        value = out[key]
        if how == "drop":
            del out[key]
        elif how == "near":
            out[key] = draw(st.sampled_from(_NEAR_MISSES))
        elif how == "value" or not isinstance(value, str):
            out[key] = draw(_JSON_VALUES)
        elif how == "grow":
            out[key] = value + draw(st.text(string.ascii_lowercase, min_size=1, max_size=300))
        else:
            at = draw(st.integers(0, len(value)))
            char = draw(_MUTATION_CHARS)
            edit = draw(st.sampled_from(["insert", "replace", "delete"]))
            if edit == "insert":
                out[key] = value[:at] + char + value[at:]
            elif edit == "replace":
                out[key] = value[:at] + char + value[at + 1 :]
            else:
                out[key] = value[:at] + value[at + 1 :]
    return out


# -- the oracle: the schema plus the rules it names in its description ----------------------


def _decimal_floats(value: Any) -> Any:
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, dict):
        return {k: _decimal_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decimal_floats(v) for v in value]
    return value


def _utc(text: str) -> datetime | None:
    """The instant rounded up to whole microseconds, in UTC; None if out of range."""
    fraction = text.partition(".")[2]
    digits = fraction[: len(fraction) - len(fraction.lstrip("0123456789"))]
    try:
        at = datetime.fromisoformat(text.upper()).astimezone(UTC)
    except (ValueError, OverflowError):
        return None
    if digits[6:].strip("0"):
        at += timedelta(microseconds=1)
    return at


def _no_surrogates(document: dict[str, Any]) -> bool:
    return not any(
        isinstance(v, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in v) for v in document.values()
    )


def schema_accepts_ack(body: str) -> bool:
    document = json.loads(body, parse_float=Decimal)
    if not ACK_SCHEMA.is_valid(document):
        return False
    if not _no_surrogates(document):
        return False
    read_at = _utc(document["read_at"])
    if read_at is None:
        return False
    if document["committed_at"] is None:
        return True
    committed = _utc(document["committed_at"])
    return committed is not None and committed >= read_at


def python_accepts_ack(body: str) -> bool:
    try:
        protocol.decode_ack(body)
    except ProtocolError:
        return False
    return True


@_SETTINGS
@given(valid_acks())
def test_every_valid_ack_is_accepted_by_both(document: dict[str, Any]) -> None:
    body = json.dumps(document)
    assert schema_accepts_ack(body)
    assert python_accepts_ack(body)


@_SETTINGS
@given(valid_acks().flatmap(_mutated))
def test_the_ack_codec_accepts_exactly_what_the_schema_accepts(document: dict[str, Any]) -> None:
    body = json.dumps(document)
    assert python_accepts_ack(body) == schema_accepts_ack(body), body[:400]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("v", True),
        ("v", 1.0),
        ("v", "1"),
        ("read_at", "2026-11-21 22:13:41Z"),  # a space: fromisoformat takes it
        ("read_at", "2026-11-21T22:13:41"),  # no offset
        ("read_at", "2026-11-21T22:13Z"),  # no seconds
        ("read_at", "2026-W47-6T22:13:41Z"),  # a week date
        ("read_at", "20261121T221341Z"),  # basic format
        ("read_at", "2026-11-21T22:13:60Z"),  # a leap second
        ("read_at", "2026-02-30T22:13:41Z"),
        ("token", "AB" * 32),
        ("recipient", ""),
        ("destination", "q\x00"),
        ("destination", "q\x1f"),
    ],
)
def test_examples_both_refuse(field: str, value: object) -> None:
    document = {
        "v": 1,
        "ack_id": "a1",
        "cm_id": "c1",
        "destination": "q",
        "recipient": None,
        "receiver": "rx",
        "kind": "read",
        "read_at": "2026-11-21T22:13:41.123456Z",
        "committed_at": None,
        "token": "ab" * 32,
        field: value,
    }
    body = json.dumps(document)
    assert not schema_accepts_ack(body)
    assert not python_accepts_ack(body)


def test_the_schemas_share_the_codecs_patterns_and_lengths() -> None:
    for validator in (ACK_SCHEMA, HEADERS_SCHEMA):
        defs = validator.schema["$defs"]
        assert defs["instant"]["pattern"] == protocol.INSTANT_PATTERN
        assert defs["instant"]["maxLength"] == protocol.MAX_INSTANT_CHARS
        assert defs["token"]["pattern"] == protocol.TOKEN_PATTERN
    fields = ACK_SCHEMA.schema["properties"]
    assert {
        name: fields[name]["maxLength"] for name in ("ack_id", "cm_id", "destination", "receiver")
    } == {
        name: protocol.ACK_FIELD_CHARS[name]
        for name in ("ack_id", "cm_id", "destination", "receiver")
    }
    assert fields["recipient"]["anyOf"][1]["maxLength"] == protocol.ACK_FIELD_CHARS["recipient"]


# -- headers ------------------------------------------------------------------------------


@st.composite
def valid_headers(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["original", "compensation", "success"]))
    headers: dict[str, Any] = {
        protocol.H_VERSION: 1,
        protocol.H_KIND: kind,
        protocol.H_CM_ID: draw(st.text(_NAME_CHARS, min_size=1, max_size=36)),
        protocol.H_DESTINATION: draw(_names(255)).strip("\x00") or "q",
        protocol.H_SENDER: draw(st.text(_NAME_CHARS, min_size=1, max_size=255)),
        protocol.H_SENT_AT: draw(_instants())[1],
        "app-header": draw(_JSON_VALUES),
    }
    headers[protocol.H_DESTINATION] = headers[protocol.H_DESTINATION][:255]
    if draw(st.booleans()):
        headers[protocol.H_RECIPIENT] = draw(st.text(_NAME_CHARS, min_size=1, max_size=255))
    if kind == "original" or draw(st.booleans()):
        headers[protocol.H_TOKEN] = draw(st.text("0123456789abcdef", min_size=64, max_size=64))
    if kind == "original":
        headers[protocol.H_REQUIRES] = draw(st.sampled_from(["none", "pickup", "process"]))
        if draw(st.booleans()):
            size = draw(st.integers(2, 2**31 - 1))
            headers[protocol.H_SEQ_ID] = draw(st.text(string.hexdigits, min_size=1, max_size=64))
            headers[protocol.H_SEQ_SIZE] = size
            headers[protocol.H_SEQ_POS] = draw(st.integers(0, size - 1))
    return headers


def schema_accepts_headers(headers: dict[str, Any]) -> bool:
    if not HEADERS_SCHEMA.is_valid(_decimal_floats(headers)):
        return False
    if protocol.H_VERSION not in headers:
        return True
    # Names hold no unpaired surrogate; the application's own headers are not checked.
    own = {k: v for k, v in headers.items() if k.startswith("condmsg-")}
    if not _no_surrogates(own) or _utc(headers[protocol.H_SENT_AT]) is None:
        return False
    if protocol.H_SEQ_ID in headers:
        return bool(headers[protocol.H_SEQ_POS] < headers[protocol.H_SEQ_SIZE])
    return True


def python_accepts_headers(headers: dict[str, Any]) -> bool:
    try:
        parse(headers, "acks")
    except InvalidMessage:
        return False
    return True


@_SETTINGS
@given(valid_headers())
def test_every_valid_header_table_is_accepted_by_both(headers: dict[str, Any]) -> None:
    assert schema_accepts_headers(headers)
    assert python_accepts_headers(headers)


@_SETTINGS
@given(valid_headers().flatmap(_mutated))
def test_inbound_parse_accepts_exactly_what_the_schema_accepts(headers: dict[str, Any]) -> None:
    assert python_accepts_headers(headers) == schema_accepts_headers(headers), repr(headers)[:400]
