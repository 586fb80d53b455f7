"""The test vectors shipped in ``condmsg/schema/vectors/`` hold for condmsg's own code.

The vectors are data: each states its input and the result the specification
(docs/protocol.md) gives it, reviewed by hand. Nothing here derives an expectation from
the code under test; it only decodes the inputs as the files write them and compares.
Other implementations run their own code against the same files.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import pika.data
import pytest

from ackd import field_types
from ackd.emit import ack_message
from ackd.validation import (
    Inbound,
    InvalidMessage,
    check_message_id,
    check_payload,
    check_token,
    parse,
)
from condmsg import (
    Condition,
    ConditionError,
    ProtocolError,
    condition_from_json,
    condition_to_json,
)
from condmsg.core import protocol
from condmsg.core.acks import AckKind
from condmsg.core.payloads import decode_payload

field_types.install()  # as every Receiver's broker does

VECTORS = resources.files("condmsg") / "schema" / "vectors"
FILES = (
    "tokens.json",
    "token_checks.json",
    "instants.json",
    "headers.json",
    "messages.json",
    "payloads.json",
    "acks.json",
    "conditions.json",
)
T = TypeVar("T")
#: An ack's other fields, for the trace context a vector's ack carries.
_ACK: dict[str, Any] = {
    "kind": AckKind.READ,
    "read_at": datetime(2026, 11, 21, 22, 13, 42, tzinfo=UTC),
    "committed_at": None,
    "recipient": "vectors",
    "receiver": "vectors",
}
#: Capabilities a vector may need (docs/protocol.md, Test vectors).
KNOWN_CAPABILITIES = frozenset({"field-types", "raw-strings"})
#: Those of condmsg's receiver: pika hands over the bytes of a long string that is not
#: UTF-8, tells a decimal from an integer, and (with ``ackd.field_types``, which the
#: receiver installs) decodes a double or a float as a float, not as an integer.
CAPABILITIES = frozenset({"field-types", "raw-strings"})


def _load(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((VECTORS / name).read_text(encoding="utf-8"))
    return document


def _vectors(name: str) -> list[Any]:
    return [pytest.param(v, id=v["name"], marks=_marks(v)) for v in _load(name)["vectors"]]


def _marks(vector: dict[str, Any]) -> list[pytest.MarkDecorator]:
    """Skip a vector that needs what condmsg's receiver lacks (as any implementation
    does)."""
    lacking = set(vector.get("needs", [])) - CAPABILITIES
    if lacking:
        return [pytest.mark.skip(reason=f"needs {', '.join(sorted(lacking))}")]
    return []


def _bytes(value: Any) -> bytes:
    """Bytes as the files write them: ``{"utf8": ...}`` or ``{"hex": ...}``, with an
    optional ``times``, or a list of those, concatenated."""
    if isinstance(value, list):
        return b"".join(_bytes(piece) for piece in value)
    one = value["utf8"].encode("utf-8") if "utf8" in value else bytes.fromhex(value["hex"])
    times: int = value.get("times", 1)
    return one * times


def _secret(value: Any) -> bytes | None:
    return None if value is None else _bytes(value)


def _field(value: Any) -> bytes:
    """The AMQP field value (type octet and data) that ``value`` stands for in the files."""
    if isinstance(value, bool):
        return b"t" + bytes([value])
    if value is None:
        return b"V"
    if isinstance(value, int):
        return struct.pack(">ci", b"I", value) if -(2**31) <= value < 2**31 else _int64(value)
    if isinstance(value, str):
        return b"S" + _long_string(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, list):
        items = b"".join(_field(v) for v in value)
        return b"A" + struct.pack(">I", len(items)) + items
    if "int64" in value:
        return _int64(int(value["int64"]))
    if "float" in value:
        return struct.pack(">cd", b"d", float(value["float"]))
    if "decimal" in value:
        exponent = Decimal(value["decimal"]).as_tuple().exponent
        scale = -exponent if isinstance(exponent, int) and exponent < 0 else 0
        return struct.pack(">cBi", b"D", scale, int(Decimal(value["decimal"]).scaleb(scale)))
    if "table" in value:
        return b"F" + _table(value["table"])
    return b"S" + _long_string(bytes.fromhex(value["string_hex"]))


def _int64(value: int) -> bytes:
    return struct.pack(">cq", b"l", value)


def _long_string(raw: bytes) -> bytes:
    return struct.pack(">I", len(raw)) + raw


def _table(table: dict[str, Any]) -> bytes:
    entries = b"".join(
        bytes([len(name.encode())]) + name.encode() + _field(value) for name, value in table.items()
    )
    return struct.pack(">I", len(entries)) + entries


def _headers(table: dict[str, Any]) -> dict[str, Any]:
    """What pika hands a receiver for a headers table written as the files write it: the
    table is encoded as it travels and decoded by pika's own codec, with the receiver's
    decoding of floating-point fields installed."""
    decoded, _ = pika.data.decode_table(_table(table), 0)
    return {str(name): value for name, value in decoded.items()}


def _outcome(call: Callable[[], T], *errors: type[Exception]) -> T | Exception:
    """What ``call`` returns, or the error of ``errors`` it raised."""
    try:
        return call()
    except errors as exc:
        return exc


def _check_disposition(expect: dict[str, Any], outcome: object) -> None:
    """``expect["receiver"]`` names what a receiver does with the delivery, and it follows
    from the judgement: a refused one goes to the invalid-message queue, a part to the
    store, a plain message to the app, any other conditional message to the receiver log."""
    if isinstance(outcome, Exception):
        disposition = "invalid-queue"
    else:
        assert isinstance(outcome, Inbound)
        if outcome.kind is None:
            disposition = "deliver-plain"
        elif outcome.seq_id is not None:
            disposition = "store-part"
        else:
            disposition = "receiver-log"
    assert expect["receiver"] == disposition


def _check_refusal(expect: dict[str, Any], outcome: object) -> bool:
    """True (after checking it against ``expect``) if ``outcome`` is a refusal."""
    if not isinstance(outcome, Exception):
        assert expect["valid"], f"accepted, expected {expect.get('reason')!r}"
        return False
    assert not expect["valid"], f"refused: {outcome}"
    assert type(outcome).__name__ == expect["error"]
    assert str(outcome) == expect["reason"]
    return True


# -- the files themselves --------------------------------------------------------------------


def test_the_directory_holds_exactly_the_documented_files() -> None:
    present = sorted(p.name for p in VECTORS.iterdir() if p.name.endswith(".json"))
    assert present == sorted(FILES)
    spec = (Path(__file__).parents[2] / "docs" / "protocol.md").read_text(encoding="utf-8")
    for name in FILES:
        assert f"`{name}`" in spec, f"docs/protocol.md does not describe {name}"


@pytest.mark.parametrize("name", FILES)
def test_each_file_is_well_formed(name: str) -> None:
    document = _load(name)
    assert document["protocol_version"] == protocol.PROTOCOL_VERSION
    assert document["description"]
    names = [v["name"] for v in document["vectors"]]
    assert names and len(names) == len(set(names))
    for vector in document["vectors"]:
        expect = vector["expect"]
        assert isinstance(expect["valid"], bool), vector["name"]
        if not expect["valid"]:
            assert expect["error"] and expect["reason"], vector["name"]
        assert set(vector.get("needs", [])) <= KNOWN_CAPABILITIES, vector["name"]
    assert any(v["expect"]["valid"] for v in document["vectors"])


# -- tokens ----------------------------------------------------------------------------------


@pytest.mark.parametrize("vector", _vectors("tokens.json"))
def test_tokens(vector: dict[str, Any]) -> None:
    secret = _bytes(vector["secret"])
    kind, cm_id, destination = vector["kind"], vector["cm_id"], vector["destination"]
    recipient = vector["recipient"]
    if kind == "copy":
        token = protocol.copy_token(secret, cm_id, destination, recipient)
    else:
        body = _bytes(vector["body"])
        token = protocol.control_token(secret, kind, cm_id, destination, recipient, body)
    assert token == vector["expect"]["token"]


@pytest.mark.parametrize("vector", _vectors("token_checks.json"))
def test_token_checks(vector: dict[str, Any]) -> None:
    """A well-formed token verifies or not, alike for the bare check and for a receiver
    judging a message that carries it; a malformed one makes the message invalid before
    any secret is used."""
    secret, expect = _bytes(vector["secret"]), vector["expect"]
    kind, token = vector["kind"], vector["token"]
    fields = (vector["cm_id"], vector["destination"], vector["recipient"])
    body = _bytes(vector["body"]) if kind != "copy" else b""
    headers = {
        protocol.H_VERSION: 1,
        protocol.H_KIND: "original" if kind == "copy" else kind,
        protocol.H_CM_ID: fields[0],
        protocol.H_DESTINATION: fields[1],
        protocol.H_SENDER: "vectors",
        protocol.H_SENT_AT: "2026-11-21T22:13:41Z",
        protocol.H_TOKEN: token,
    }
    if fields[2] is not None:
        headers[protocol.H_RECIPIENT] = fields[2]
    inbound = _outcome(lambda: parse(_headers(headers), "condmsg.vectors.ack"), InvalidMessage)
    if _check_refusal(expect, inbound):
        return
    assert isinstance(inbound, Inbound)
    if kind == "copy":
        verifies = protocol.verify_token(secret, token, *fields)
    else:
        verifies = protocol.verify_control_token(secret, token, kind, *fields, body)
    assert verifies is expect["verifies"]
    judged = _outcome(lambda: check_token(inbound, secret, body), InvalidMessage)
    assert (judged is None) is expect["verifies"], judged


# -- instants --------------------------------------------------------------------------------


@pytest.mark.parametrize("vector", _vectors("instants.json"))
def test_instants(vector: dict[str, Any]) -> None:
    expect = vector["expect"]
    parsed = _outcome(lambda: protocol.parse_instant(vector["value"], "value"), ProtocolError)
    if not _check_refusal(expect, parsed):
        assert isinstance(parsed, datetime)
        assert protocol.format_instant(parsed) == expect["utc"]


# -- headers and whole messages --------------------------------------------------------------


def _parsed(inbound: Any) -> dict[str, Any]:
    return {
        "kind": inbound.kind.value,
        "cm_id": inbound.cm_id,
        "destination": inbound.destination,
        "recipient": inbound.recipient,
        "sender": inbound.sender,
        "sent_at": protocol.format_instant(inbound.sent_at),
        "token": inbound.token,
        "reply_to": inbound.reply_to,
        "seq_id": inbound.seq_id,
        "seq_pos": inbound.seq_pos,
        "seq_size": inbound.seq_size,
    }


@pytest.mark.parametrize("vector", _vectors("headers.json"))
def test_headers(vector: dict[str, Any]) -> None:
    expect, props = vector["expect"], vector["properties"]

    def judge() -> Inbound:
        inbound = parse(_headers(vector["headers"]), props.get("reply_to"))
        check_message_id(props.get("message_id"), inbound)
        return inbound

    inbound = _outcome(judge, InvalidMessage)
    _check_disposition(expect, inbound)
    if _check_refusal(expect, inbound):
        return
    assert isinstance(inbound, Inbound)
    assert (inbound.kind is None) is expect["plain"]
    if inbound.kind is not None:
        assert _parsed(inbound) == expect["parsed"]
    if "trace" in expect:  # what the ack passes on (a receiver that records no span)
        assert isinstance(inbound, Inbound)
        assert ack_message(inbound, **_ACK).headers == expect["trace"]


@pytest.mark.parametrize("vector", _vectors("messages.json"))
def test_messages(vector: dict[str, Any]) -> None:
    """A receiver's judgement of one delivery, in the order of docs/protocol.md."""
    expect, props = vector["expect"], vector["properties"]
    body = _bytes(vector["body"])

    def judge() -> Inbound:
        inbound = parse(_headers(vector["headers"]), props.get("reply_to"))
        check_message_id(props.get("message_id"), inbound)
        check_token(inbound, _secret(vector["secret"]), body)
        if inbound.seq_id is None:
            check_payload(body, props.get("content_type"))
        return inbound

    inbound = _outcome(judge, InvalidMessage)
    _check_disposition(expect, inbound)
    if _check_refusal(expect, inbound):
        return
    assert isinstance(inbound, Inbound)
    assert (inbound.kind is None) is expect["plain"]
    assert (inbound.seq_id is not None) is expect["part"]
    assert (inbound.kind.value if inbound.kind is not None else None) == expect["kind"]


# -- payloads --------------------------------------------------------------------------------


@pytest.mark.parametrize("vector", _vectors("payloads.json"))
def test_payloads(vector: dict[str, Any]) -> None:
    expect = vector["expect"]
    body = _bytes(vector["body"])
    # A body that does not decode makes the receiver move its message to the invalid queue
    # with this reason (ackd.validation.check_payload raises InvalidMessage with it).
    value = _outcome(lambda: check_payload(body, vector["content_type"]), InvalidMessage)
    if _check_refusal(expect, value):
        return
    value = decode_payload(body, vector["content_type"])
    if expect["as"] == "bytes":
        assert value == bytes.fromhex(expect["value"])
    elif expect["as"] == "text":
        assert value == expect["value"]
    else:
        assert expect["as"] == "json"
        assert value == expect["value"]
        assert type(value) is type(expect["value"])


# -- acks ------------------------------------------------------------------------------------


@pytest.mark.parametrize("vector", _vectors("acks.json"))
def test_acks(vector: dict[str, Any]) -> None:
    expect = vector["expect"]
    decoded = _outcome(lambda: protocol.decode_ack(_bytes(vector["body"])), ProtocolError)
    if not _check_refusal(expect, decoded):
        assert isinstance(decoded, tuple)
        assert decoded[0].to_dict() == expect["ack"]


# -- conditions ------------------------------------------------------------------------------


@pytest.mark.parametrize("vector", _vectors("conditions.json"))
def test_conditions(vector: dict[str, Any]) -> None:
    expect = vector["expect"]
    condition = _outcome(lambda: condition_from_json(vector["document"]), ConditionError)
    if not _check_refusal(expect, condition):
        assert isinstance(condition, Condition)
        assert json.loads(condition_to_json(condition)) == expect["canonical"]
