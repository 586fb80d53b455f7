"""Scenario ``malformed-headers``: every message of the protocol's header vectors
(``condmsg/schema/vectors/headers.json``) that a receiver must move to its
invalid-message queue is sent on the wire, and each must arrive there with a reason and
the queue it came from, none may reach the app, and none may earn an ack.

The vectors are written for a deployment of their own (a CM id, a secret, an ack queue);
each is sent with what only identifies it made the run's own: a fresh CM id and message
id, the run's ack queue as ``reply_to``, and a token computed with the run's secret, so
that the one rule the vector breaks is the reason to refuse it. A value that is itself the
vector's point (a token in upper case, a CM id of 37 characters) is sent as written.
Vectors that need a capability (``needs``) or a value pika cannot encode (a double) are
left out: the harness publishes with pika.
"""

from __future__ import annotations

import json
import re
import uuid
from decimal import Decimal
from importlib import resources
from typing import Any

import pika.compat

from condmsg.conformance import acks
from condmsg.conformance.expect import DELIVERY_S, expect_moved
from condmsg.conformance.world import NotMet, TimedOut, World
from condmsg.core import protocol
from condmsg.core.errors import CondmsgError

VECTORS = resources.files("condmsg") / "schema" / "vectors" / "headers.json"
#: What the vectors write for the values a run makes its own.
VECTOR_CM_ID = "5d7e2b1c-9a40-4e7b-8f1d-2c3b4a5d6e7f"
VECTOR_MESSAGE_ID = "9f0c3a4b5c6d7e8f9a0b1c2d3e4f5a6b"
VECTOR_REPLY_TO = "condmsg.meetings.ack"
_TOKEN = re.compile(r"[0-9a-f]{64}")


class Unsendable(CondmsgError):
    """A header value pika cannot put on the wire as the vector writes it."""


def invalid_vectors() -> list[dict[str, Any]]:
    """The vectors a receiver moves to its invalid-message queue, that pika can send."""
    document = json.loads(VECTORS.read_text(encoding="utf-8"))
    found = []
    for vector in document["vectors"]:
        if vector["expect"].get("receiver") != "invalid-queue" or vector.get("needs"):
            continue
        try:
            {name: _value(value) for name, value in vector["headers"].items()}
        except Unsendable:
            continue
        found.append(vector)
    return found


def _value(value: Any) -> Any:
    """The Python value pika encodes as the AMQP field ``value`` stands for."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, list):
        return [_value(v) for v in value]
    if "int64" in value:
        return pika.compat.long(value["int64"])
    if "decimal" in value:
        return Decimal(value["decimal"])
    if "table" in value:
        return {name: _value(v) for name, v in value["table"].items()}
    raise Unsendable(f"pika cannot send {value!r}")


def _own(value: Any, fresh: str) -> Any:
    """``value`` with the vectors' message id replaced by ``fresh`` (keeping a part's
    ``.N``)."""
    if isinstance(value, str) and value.startswith(VECTOR_MESSAGE_ID):
        return fresh + value[len(VECTOR_MESSAGE_ID) :]
    return value


def message(w: World, vector: dict[str, Any], body: bytes) -> tuple[pika.BasicProperties, str]:
    """The vector as this run sends it, and the CM id it carries (or its marker)."""
    headers = {name: _value(value) for name, value in vector["headers"].items()}
    fresh = uuid.uuid4().hex
    cm_id = str(uuid.uuid4())
    if headers.get(protocol.H_CM_ID) == VECTOR_CM_ID:
        headers[protocol.H_CM_ID] = cm_id
    headers = {name: _own(value, fresh) for name, value in headers.items()}
    token = headers.get(protocol.H_TOKEN)
    if isinstance(token, str) and _TOKEN.fullmatch(token):
        headers[protocol.H_TOKEN] = _token(w, headers, body)
    props = vector.get("properties", {})
    reply_to = props.get("reply_to")
    return pika.BasicProperties(
        message_id=_own(props.get("message_id"), fresh),
        reply_to=protocol.ack_queue(w.sender_name) if reply_to == VECTOR_REPLY_TO else reply_to,
        content_type="application/octet-stream",
        headers=headers,
        delivery_mode=2,
    ), cm_id


def _token(w: World, headers: dict[str, Any], body: bytes) -> str:
    """The token the run's secret gives these headers, where they name a copy or a notice
    a token can be computed for; else the vector's own."""
    fields = [headers.get(h) for h in (protocol.H_CM_ID, protocol.H_DESTINATION)]
    recipient = headers.get(protocol.H_RECIPIENT)
    kind = headers.get(protocol.H_KIND)
    if not all(isinstance(f, str) for f in fields) or not isinstance(recipient, str | None):
        return str(headers[protocol.H_TOKEN])
    cm_id, destination = str(fields[0]), str(fields[1])
    if kind in ("compensation", "success"):
        return protocol.control_token(w.secret, kind, cm_id, destination, recipient, body)
    return protocol.copy_token(w.secret, cm_id, destination, recipient)


def malformed_headers(w: World) -> str:
    sent: dict[bytes, tuple[str, str]] = {}  # body -> (vector name, CM id)
    for vector in invalid_vectors():
        body = f"malformed:{uuid.uuid4().hex}".encode()
        props, cm_id = message(w, vector, body)
        sent[body] = (vector["name"], cm_id)
        w.publish_raw(body, props)

    def missing() -> list[str]:
        moved = {m.body for m in w.invalid()}
        return [name for body, (name, _) in sent.items() if body not in moved]

    def delivered() -> list[str]:
        return [sent[r.body][0] for r in w.received() if r.body in sent]

    def all_moved() -> bool:
        handed = delivered()
        if handed:  # known at once, rather than when the wait for the rest runs out
            raise NotMet(f"the app got malformed messages, e.g. {handed[0]!r}")
        return not missing()

    try:
        w.wait_for(all_moved, w.scaled(DELIVERY_S), "every malformed message moved")
    except TimedOut:
        left = missing()
        shown = "; ".join(left[:4]) + (f" and {len(left) - 4} more" if len(left) > 4 else "")
        raise NotMet(f"{len(left)} of {len(sent)} malformed messages not moved: {shown}") from None
    for found in w.invalid():
        if found.body in sent:
            expect_moved(w, found, f"the malformed message {sent[found.body][0]!r}")
    w.settle()
    handed = delivered()
    if handed:
        raise NotMet(f"the app got {len(handed)} malformed messages, e.g. {handed[0]!r}")
    acks.flush(w)
    acked_ids = acks.ack_ids(w, (cm for _, cm in sent.values()))
    acked = [name for name, cm_id in sent.values() if acked_ids[cm_id]]
    if acked:
        raise NotMet(f"the receiver acked {len(acked)} malformed messages, e.g. {acked[0]!r}")
    return f"all {len(sent)} malformed headers of the vectors moved with a reason, none acked"
