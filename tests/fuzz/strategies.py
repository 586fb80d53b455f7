"""Generators of inbound input, valid and bad, for every surface the services read.

Bad input comes in the shapes an attacker or a clumsy client produces: random bytes,
truncations of valid documents, huge values (long strings, 10**30, NaN and infinities,
which Python's ``json`` reads and writes), nesting thousands of levels deep, wrong types
for every field, extra fields, and single mutations of a valid message (a field dropped,
a type swapped, a character of a timestamp flipped, the version as ``true``/``1.0``/``2``,
NUL and control characters in names).

Deep nesting is built as text, never as Python objects: a nested object thousands of
levels deep could not even be serialised (``json.dumps`` recurses too).

The limits are those of ``docs/protocol.md`` (the ack and header schema) and
``docs/conditions.md`` (condition documents).
"""

from __future__ import annotations

import json
import string
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import strategies as st

from condmsg.core import protocol

#: The documented bounds of an ack (docs/protocol.md), as the codec defines them.
ACK_BODY_MAX = protocol.MAX_ACK_BYTES
ACK_ID_MAX = protocol.MAX_ACK_ID_CHARS
CM_ID_MAX = protocol.MAX_CM_ID_CHARS
NAME_MAX = protocol.MAX_NAME_CHARS
#: Fields of the ack document holding names (destination, recipient identity, receiver).
ACK_NAME_FIELDS = ("destination", "recipient", "receiver")
ACK_FIELDS = tuple(sorted(protocol.ACK_FIELDS))
#: The longest value of each text field of an ack.
ACK_TEXT_MAX = {
    "ack_id": ACK_ID_MAX,
    "cm_id": CM_ID_MAX,
    "destination": NAME_MAX,
    "recipient": NAME_MAX,
    "receiver": NAME_MAX,
    "token": 64,
}

#: Characters every name may hold (queue names, identities): what valid input is made of.
NAME_ALPHABET = string.ascii_letters + string.digits + "._-:"
HEX = "0123456789abcdef"

#: Nesting depths far beyond any limit (and beyond CPython's recursion limit of 1000).
DEEP = st.integers(min_value=1_000, max_value=60_000)
#: Depths around the interpreter's recursion limit, where a recursive decoder turns over.
NEAR_LIMIT = st.integers(min_value=200, max_value=2_000)


def names(max_size: int = NAME_MAX) -> st.SearchStrategy[str]:
    return st.text(NAME_ALPHABET, min_size=1, max_size=max_size)


def instants() -> st.SearchStrategy[datetime]:
    return st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2090, 1, 1), timezones=st.just(UTC)
    )


# -- junk -----------------------------------------------------------------------------------

CONTROL = "".join(chr(c) for c in [*range(0, 32), 127])


def control_text() -> st.SearchStrategy[str]:
    """Short names holding NUL and other control characters."""
    return st.builds(
        lambda head, ctl, tail: head + ctl + tail,
        names(20),
        st.text(CONTROL, min_size=1, max_size=3),
        st.text(NAME_ALPHABET, max_size=20),
    )


def deep_json_text(depth: int, leaf: str = "1", kind: str = "[") -> str:
    """``[[[...1...]]]`` (or objects ``{"a":{"a":...}}``) ``depth`` levels deep, as text."""
    if kind == "[":
        return "[" * depth + leaf + "]" * depth
    return '{"a":' * depth + leaf + "}" * depth


def junk_values() -> st.SearchStrategy[Any]:
    """A JSON value of a type no field expects, or of the right type but unusable."""
    return st.one_of(
        st.sampled_from(
            [
                None,
                True,
                False,
                0,
                -1,
                1.0,
                10**30,
                -(10**30),
                float("nan"),
                float("inf"),
                float("-inf"),
                "",
                " ",
                "\x00",
                "null",
                "1",
                [],
                {},
                [1],
                {"v": 1},
            ]
        ),
        st.integers(),
        st.floats(),
        st.text(max_size=30),
        control_text(),
        st.text(NAME_ALPHABET, min_size=NAME_MAX + 1, max_size=NAME_MAX * 3),
        st.lists(st.integers(), max_size=3),
    )


def random_bytes() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.binary(max_size=200),
        st.text(max_size=200).map(lambda s: s.encode("utf-8", "surrogatepass")),
        st.sampled_from([b"", b"null", b"[]", b"{}", b'"x"', b"1e999", b"NaN", b"\xff\xfe"]),
    )


# -- acks -----------------------------------------------------------------------------------

#: A schema-valid ack document, for explicit examples of single mutations.
BASE_ACK: dict[str, Any] = {
    "v": 1,
    "ack_id": "0f3c2a9e5b7d4e1f8a6c3b2d1e0f9a8b",
    "cm_id": "6f1c0f0e-2a4b-4c8d-9e1f-0a2b3c4d5e6f",
    "destination": "orders.q",
    "recipient": None,
    "receiver": "rx-1",
    "kind": "read",
    "read_at": "2026-11-21T22:13:41.123456Z",
    "committed_at": None,
    "token": "ab" * 32,
}


@st.composite
def valid_ack_docs(draw: st.DrawFn) -> dict[str, Any]:
    """A schema-valid ack document (not necessarily one the evaluator would count)."""
    read_at = draw(instants())
    kind = draw(st.sampled_from(["read", "commit"]))
    committed_at = None
    if kind == "commit":
        committed_at = read_at + draw(st.timedeltas(timedelta(0), timedelta(hours=1)))
    return {
        "v": 1,
        "ack_id": draw(names(ACK_ID_MAX)),
        "cm_id": str(draw(st.uuids())),
        "destination": draw(names()),
        "recipient": draw(st.none() | names()),
        "receiver": draw(names()),
        "kind": kind,
        "read_at": protocol.format_instant(read_at),
        "committed_at": None if committed_at is None else protocol.format_instant(committed_at),
        "token": draw(st.text(HEX, min_size=64, max_size=64)),
    }


def dumps(doc: object) -> bytes:
    """JSON as Python writes it: NaN and Infinity included, non-ASCII as UTF-8."""
    return json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogatepass")


@st.composite
def mutated_ack_docs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid ack document with one or more mutations."""
    doc = dict(draw(valid_ack_docs()))
    for _ in range(draw(st.integers(1, 3))):
        mutation = draw(
            st.sampled_from(
                ["drop", "junk", "extra", "version", "timestamp", "long", "control", "swap"]
            )
        )
        field = draw(st.sampled_from(ACK_FIELDS))
        if mutation == "drop":
            doc.pop(field, None)
        elif mutation == "junk":
            doc[field] = draw(junk_values())
        elif mutation == "extra":
            doc[draw(st.text(max_size=10).filter(lambda k: k not in ACK_FIELDS))] = draw(
                junk_values()
            )
        elif mutation == "version":
            doc["v"] = draw(
                st.sampled_from([True, False, 1.0, 2, 0, -1, "1", None, 10**30, [1], 1.5])
            )
        elif mutation == "timestamp":
            stamp = draw(st.sampled_from(["read_at", "committed_at"]))
            doc[stamp] = draw(mutated_timestamps(doc.get(stamp) or "2026-11-21T22:13:41.123456Z"))
        elif mutation == "long":
            text_field = draw(st.sampled_from(sorted(ACK_TEXT_MAX)))
            doc[text_field] = "x" * (ACK_TEXT_MAX[text_field] + draw(st.integers(1, 5000)))
        elif mutation == "control":
            doc[draw(st.sampled_from(["ack_id", "cm_id", *ACK_NAME_FIELDS]))] = draw(control_text())
        else:  # swap two fields' values
            other = draw(st.sampled_from(ACK_FIELDS))
            doc[field], doc[other] = doc.get(other), doc.get(field)
    return doc


@st.composite
def mutated_timestamps(draw: st.DrawFn, stamp: object) -> object:
    """A timestamp with one character flipped, cut, or made implausible."""
    text = stamp if isinstance(stamp, str) and stamp else "2026-11-21T22:13:41.123456Z"
    choice = draw(st.integers(0, 3))
    if choice == 0:
        i = draw(st.integers(0, len(text) - 1))
        return text[:i] + draw(st.characters(codec="utf-8")) + text[i + 1 :]
    if choice == 1:
        return text[: draw(st.integers(0, len(text) - 1))]
    if choice == 2:
        return draw(
            st.sampled_from(
                [
                    "0001-01-01T00:00:00+05:00",  # before year 1 in UTC
                    "9999-12-31T23:59:59-05:00",  # after year 9999 in UTC
                    "2026-11-21T22:13:41",  # no offset
                    "2026-11-21 22:13:41Z",
                    "2026-11-21t22:13:41z",
                    "2026-13-40T25:61:61Z",
                    "20261121T221341Z",
                    "2026-11-21",
                ]
            )
        )
    return draw(junk_values())


def truncations(body: bytes) -> st.SearchStrategy[bytes]:
    return st.integers(0, max(0, len(body) - 1)).map(lambda n: body[:n])


@st.composite
def deep_ack_bodies(draw: st.DrawFn) -> bytes:
    """An ack body nested thousands of levels deep: the whole body, or one field."""
    depth = draw(st.one_of(DEEP, NEAR_LIMIT))
    kind = draw(st.sampled_from(["[", "{"]))
    nested = deep_json_text(depth, kind=kind)
    if draw(st.booleans()):
        return nested.encode()
    doc = draw(valid_ack_docs())
    field = draw(st.sampled_from(ACK_FIELDS))
    marker = "__DEEP__"
    doc[field] = marker
    return json.dumps(doc).replace(json.dumps(marker), nested).encode()


def bad_ack_bodies() -> st.SearchStrategy[bytes]:
    """Ack bodies of every bad shape (most are malformed; a mutation may leave one valid)."""
    return st.one_of(
        random_bytes(),
        valid_ack_docs().map(dumps).flatmap(truncations),
        mutated_ack_docs().map(dumps),
        deep_ack_bodies(),
        huge_ack_bodies(),
        st.lists(junk_values(), max_size=3).map(dumps),
    )


@st.composite
def huge_ack_bodies(draw: st.DrawFn) -> bytes:
    """A valid document made larger than :data:`ACK_BODY_MAX` (padding or a long field)."""
    doc = draw(valid_ack_docs())
    if draw(st.booleans()):
        body = dumps(doc)
        padding = ACK_BODY_MAX + 1 - len(body) + draw(st.integers(0, 10**5))
        return body[:-1] + b" " * padding + b"}"
    doc[draw(st.sampled_from(ACK_FIELDS))] = "x" * draw(st.integers(ACK_BODY_MAX, 10**6))
    return dumps(doc)


def new_ack_id() -> str:
    return uuid.uuid4().hex


# -- copy headers (originals, parts, compensations, notices) --------------------------------

#: The condmsg headers of a receiver-bound message, and the longest value of each name.
HEADER_TEXT_MAX = {
    protocol.H_CM_ID: CM_ID_MAX,
    protocol.H_DESTINATION: NAME_MAX,
    protocol.H_RECIPIENT: NAME_MAX,
    protocol.H_SENDER: NAME_MAX,
    protocol.H_SEQ_ID: 64,
}
HEADERS = (
    protocol.H_VERSION,
    protocol.H_KIND,
    protocol.H_CM_ID,
    protocol.H_DESTINATION,
    protocol.H_RECIPIENT,
    protocol.H_SENDER,
    protocol.H_SENT_AT,
    protocol.H_TOKEN,
    protocol.H_SEQ_ID,
    protocol.H_SEQ_POS,
    protocol.H_SEQ_SIZE,
)


#: Well-formed headers of an original copy, for explicit examples of single mutations.
BASE_HEADERS: dict[str, Any] = {
    protocol.H_VERSION: protocol.PROTOCOL_VERSION,
    protocol.H_KIND: "original",
    protocol.H_CM_ID: "6f1c0f0e-2a4b-4c8d-9e1f-0a2b3c4d5e6f",
    protocol.H_DESTINATION: "orders.q",
    protocol.H_SENDER: "shop",
    protocol.H_SENT_AT: "2026-11-21T22:13:41.123456Z",
    protocol.H_TOKEN: "ab" * 32,
}


@st.composite
def valid_headers(draw: st.DrawFn) -> dict[str, Any]:
    """Well-formed condmsg headers of an original, part, compensation or notice (their
    token well-formed, not necessarily verifying)."""
    kind = draw(st.sampled_from(list(protocol.MessageKind)))
    headers: dict[str, Any] = {
        protocol.H_VERSION: protocol.PROTOCOL_VERSION,
        protocol.H_KIND: kind.value,
        protocol.H_CM_ID: str(draw(st.uuids())),
        protocol.H_DESTINATION: draw(names()),
        protocol.H_SENDER: draw(names()),
        protocol.H_SENT_AT: protocol.format_instant(draw(instants())),
        protocol.H_TOKEN: draw(st.text(HEX, min_size=64, max_size=64)),
    }
    if draw(st.booleans()):
        headers[protocol.H_RECIPIENT] = draw(names())
    if kind is protocol.MessageKind.ORIGINAL and draw(st.booleans()):
        size = draw(st.integers(2, 50))
        headers[protocol.H_SEQ_ID] = draw(names(64))
        headers[protocol.H_SEQ_POS] = draw(st.integers(0, size - 1))
        headers[protocol.H_SEQ_SIZE] = size
    return headers


def header_junk() -> st.SearchStrategy[Any]:
    """Values of the types pika hands over in AMQP headers, most of them wrong for a field."""
    return st.one_of(
        junk_values().filter(lambda v: not isinstance(v, float) or v == v),
        st.binary(max_size=40),
        st.datetimes(timezones=st.just(UTC)),
        st.decimals(allow_nan=False, places=3),
        st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    )


@st.composite
def mutated_headers(draw: st.DrawFn) -> dict[str, Any]:
    headers = dict(draw(valid_headers()))
    for _ in range(draw(st.integers(1, 3))):
        mutation = draw(st.sampled_from(["drop", "junk", "version", "timestamp", "long", "ctl"]))
        name = draw(st.sampled_from(HEADERS))
        if mutation == "drop":
            headers.pop(name, None)
        elif mutation == "junk":
            headers[name] = draw(header_junk())
        elif mutation == "version":
            headers[protocol.H_VERSION] = draw(st.sampled_from([True, 1.0, 2, 0, "1", b"1", None]))
        elif mutation == "timestamp":
            stamp = draw(mutated_timestamps(headers.get(protocol.H_SENT_AT)))
            headers[protocol.H_SENT_AT] = stamp
        elif mutation == "long":
            text_name = draw(st.sampled_from(sorted(HEADER_TEXT_MAX)))
            headers[text_name] = "x" * (HEADER_TEXT_MAX[text_name] + draw(st.integers(1, 500)))
        else:
            headers[draw(st.sampled_from(sorted(HEADER_TEXT_MAX)))] = draw(control_text())
    return headers


# -- condition documents --------------------------------------------------------------------


def deep_condition_text(depth: int) -> str:
    """A condition document whose sets nest ``depth`` levels deep, as text."""
    leaf = '{"type":"destination","name":"q","pickup_within_ms":1000}'
    return (
        '{"schema":1,"condition":' + '{"type":"set","members":[' * depth + leaf + "]}" * depth + "}"
    )


CONDITION_NODE_FIELDS = (
    "type",
    "name",
    "recipient",
    "exchange",
    "routing_key",
    "members",
    "pickup_within_ms",
    "process_within_ms",
    "expiry_ms",
    "evaluation_timeout_ms",
    "min_pickup",
    "max_pickup",
    "min_process",
    "max_process",
    "priority",
    "persistent",
)


def _nodes(doc: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    stack: list[Any] = [doc.get("condition")]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            found.append(node)
            members = node.get("members")
            if isinstance(members, list):
                stack.extend(members)
    return found


@st.composite
def mutated_condition_docs(draw: st.DrawFn, valid: dict[str, Any]) -> object:
    """A valid condition document with one or more mutations in its nodes or its header."""
    doc: dict[str, Any] = json.loads(json.dumps(valid))
    for _ in range(draw(st.integers(1, 3))):
        nodes = _nodes(doc)
        target: dict[str, Any] = draw(st.sampled_from(nodes)) if nodes else doc
        mutation = draw(
            st.sampled_from(["drop", "junk", "extra", "huge", "name", "schema", "members"])
        )
        field = draw(st.sampled_from(CONDITION_NODE_FIELDS))
        if mutation == "drop":
            target.pop(field, None)
        elif mutation == "junk":
            target[field] = draw(junk_values())
        elif mutation == "extra":
            target[draw(st.text(max_size=8))] = draw(junk_values())
        elif mutation == "huge":
            target[draw(st.sampled_from(CONDITION_NODE_FIELDS[6:15]))] = draw(
                st.sampled_from([10**30, -(10**30), 2**63, 2**64, -1, 10**18])
            )
        elif mutation == "name":
            target[draw(st.sampled_from(["name", "recipient", "exchange", "routing_key"]))] = draw(
                control_text() | st.text(min_size=NAME_MAX + 1, max_size=2 * NAME_MAX)
            )
        elif mutation == "schema":
            doc["schema"] = draw(st.sampled_from([True, 1.0, 2, 0, "1", None, 10**30]))
        else:
            target["members"] = draw(st.sampled_from([[], [None], {}, "x", [[]], [1]]))
    return doc
