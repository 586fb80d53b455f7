"""Fuzzing a receiver on the real RabbitMQ and PostgreSQL.

One ``Receiver`` (given the deployment secret) reads one queue for the whole test; each
hypothesis example is a batch of valid messages (originals of new CMs; signed
compensations and success notices of CMs it consumed in earlier batches) interleaved with
bad ones: generated header mutations, parts with bad sequence headers, signed originals
whose JSON payload is nested thousands of levels deep, and control messages that are
unsigned or signed with a forged token. Property, per batch:

- ``Receiver.read()`` never raises;
- the app gets exactly the valid messages, each once;
- every bad message is on the invalid-message queue, with a ``condmsg-reason``.
"""

from __future__ import annotations

import hashlib
import struct
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pika
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ackd.receiver import Receiver
from condmsg import Destination
from condmsg.core import protocol
from tests.integration.condmsg_helpers import SECRET, get_all, publish_copy

from . import strategies as s
from .conftest import INTEGRATION

pytestmark = [pytest.mark.fuzz, pytest.mark.rabbitmq, pytest.mark.postgres]

#: How long a batch may take to be read (the app's messages and the invalid ones).
BATCH_DEADLINE_S = 30.0
SENDER = "fuzz-sender"


@dataclass
class Rig:
    receiver: Receiver
    channel: Any
    queue: str
    #: CMs whose original the app got and that have had no control message yet.
    consumed: list[str] = field(default_factory=list)


@pytest.fixture
def rig(pg_url: str, unique_name: str, make_receiver: Any, channel: Any) -> Rig:
    receiver = make_receiver(pg_url, secret=SECRET)
    queue = f"{unique_name}.q"
    receiver._broker.ensure_queue(queue)
    return Rig(receiver, channel, queue)


def control_headers(
    kind: protocol.MessageKind, cm_id: str, queue: str, body: bytes, token: str | None
) -> dict[str, Any]:
    """The headers of a compensation or success notice (signed with ``token``, if any)."""
    headers: dict[str, Any] = {
        protocol.H_VERSION: protocol.PROTOCOL_VERSION,
        protocol.H_KIND: kind.value,
        protocol.H_CM_ID: cm_id,
        protocol.H_DESTINATION: queue,
        protocol.H_SENDER: SENDER,
        protocol.H_SENT_AT: protocol.format_instant(datetime.now(UTC)),
    }
    if token is not None:
        headers[protocol.H_TOKEN] = token
    return headers


def signed(kind: protocol.MessageKind, cm_id: str, queue: str, body: bytes) -> str:
    """The control token the evaluator signs a compensation or notice with."""
    return str(protocol.control_token(SECRET, kind.value, cm_id, queue, None, body))


@dataclass
class Outgoing:
    headers: dict[str, Any] | None
    body: bytes
    content_type: str | None = "application/octet-stream"
    reply_to: str | None = "acks"
    message_id: str = field(default_factory=lambda: f"bad-{uuid.uuid4().hex}")


def publish(rig: Rig, message: Outgoing) -> None:
    rig.channel.basic_publish(
        "",
        rig.queue,
        message.body,
        pika.BasicProperties(
            headers=message.headers,
            content_type=message.content_type,
            reply_to=message.reply_to,
            message_id=message.message_id,
        ),
    )


def mutated(data: st.DataObject, rig: Rig) -> Outgoing:
    """Generated headers with a mutation (the version kept, so that none is a plain
    message): malformed, or well-formed with a token that does not verify."""
    headers = data.draw(s.mutated_headers().filter(_encodable), label="mutated headers")
    headers.setdefault(protocol.H_VERSION, protocol.PROTOCOL_VERSION)
    body = data.draw(st.binary(max_size=64), label="body")
    return Outgoing(headers, body, data.draw(st.sampled_from([None, "application/json"])))


def _encodable(headers: dict[str, Any]) -> bool:
    """Whether AMQP can carry ``headers`` (pika refuses a float, for one, before sending
    anything): what it cannot carry never reaches a receiver."""
    try:
        pika.BasicProperties(headers=headers).encode()
    except (pika.exceptions.UnsupportedAMQPFieldException, struct.error, ValueError, TypeError):
        return False
    return True


def deep_payload_original(data: st.DataObject, rig: Rig) -> Outgoing:
    """A genuine, signed original whose JSON payload is nested past any decoder's limit."""
    # Past the interpreter's limit whatever the stack depth of the check: around the limit
    # (about 1,000 levels) whether a payload decodes depends on how deep the caller is.
    depth = data.draw(st.integers(min_value=2_000, max_value=60_000))
    body = s.deep_json_text(depth, kind=data.draw(st.sampled_from(["[", "{"]))).encode()
    cm_id = str(uuid.uuid4())
    headers = {
        protocol.H_VERSION: protocol.PROTOCOL_VERSION,
        protocol.H_KIND: protocol.MessageKind.ORIGINAL.value,
        protocol.H_CM_ID: cm_id,
        protocol.H_DESTINATION: rig.queue,
        protocol.H_SENDER: SENDER,
        protocol.H_SENT_AT: protocol.format_instant(datetime.now(UTC)),
        protocol.H_TOKEN: protocol.copy_token(SECRET, cm_id, rig.queue, None),
    }
    return Outgoing(headers, body, "application/json")


@dataclass
class Batch:
    valid: dict[str, tuple[str, str]]  # message id -> (kind, CM id)
    bad: dict[str, Outgoing]  # by message id
    consumed: list[str]  # new CMs: their originals


def publish_batch(rig: Rig, data: st.DataObject, *, controls: bool) -> Batch:
    fresh = [str(uuid.uuid4()) for _ in range(data.draw(st.integers(1, 3), label="originals"))]
    valid: dict[str, tuple[str, str]] = {}
    bad: list[Outgoing] = [mutated(data, rig) for _ in range(data.draw(st.integers(1, 4)))]
    if data.draw(st.booleans(), label="deep payload"):
        bad.append(deep_payload_original(data, rig))
    signed_controls: list[Outgoing] = []
    if controls:
        for _ in range(min(len(rig.consumed), data.draw(st.integers(0, 3)))):
            cm_id = rig.consumed.pop(0)
            kind = data.draw(
                st.sampled_from([protocol.MessageKind.COMPENSATION, protocol.MessageKind.SUCCESS])
            )
            body = data.draw(st.binary(min_size=1, max_size=32))
            forgery = data.draw(st.sampled_from(["none", "unsigned", "forged", "other body"]))
            if forgery == "none":
                token = signed(kind, cm_id, rig.queue, body)
                message_id = f"{cm_id}.{rig.queue}.{kind.value}"
                headers = control_headers(kind, cm_id, rig.queue, body, token)
                signed_controls.append(Outgoing(headers, body, message_id=message_id))
                valid[message_id] = (kind.value, cm_id)
                continue
            token = {
                "unsigned": None,
                "forged": data.draw(st.text(s.HEX, min_size=64, max_size=64)),
                "other body": signed(kind, cm_id, rig.queue, hashlib.sha256(body).digest()),
            }[forgery]
            bad.append(Outgoing(control_headers(kind, cm_id, rig.queue, body, token), body))
    messages: list[Outgoing | str] = [*bad, *signed_controls, *fresh]
    for message in data.draw(st.permutations(messages), label="order"):
        if isinstance(message, str):  # a new CM: its original, as the relay publishes it
            publish_copy(
                rig.channel,
                cm_id=message,
                condition=Destination(rig.queue, pickup_within=timedelta(minutes=5)),
                sender=SENDER,
                sent_at=datetime.now(UTC),
                body=b"valid",
            )
        else:
            publish(rig, message)
    return Batch(valid, {m.message_id: m for m in bad}, fresh)


def read_batch(rig: Rig, batch: Batch) -> tuple[list[Any], list[str], list[tuple[Any, bytes]]]:
    """Read until the originals and control messages arrived and the queue is empty."""
    got: list[Any] = []
    errors: list[str] = []
    invalid: list[tuple[Any, bytes]] = []
    expected = len(batch.valid) + len(batch.consumed)
    deadline = datetime.now(UTC) + timedelta(seconds=BATCH_DEADLINE_S)
    while datetime.now(UTC) < deadline:
        try:
            message = rig.receiver.read(rig.queue, timeout=0.2)
        except Exception as exc:  # the property: read() never raises
            errors.append(f"read() raised {type(exc).__name__}: {str(exc)[:200]}")
            continue
        if message is not None:
            got.append(message)
            continue
        invalid += get_all(rig.channel, rig.receiver.invalid_queue, settle_s=0.1)
        if len(got) >= expected and len(invalid) >= len(batch.bad):
            break
    return got, errors, invalid


def check_batch(rig: Rig, batch: Batch) -> None:
    got, errors, invalid = read_batch(rig, batch)
    assert not errors, "\n".join(errors)
    delivered = sorted((m.kind.value if m.kind else None, m.cm_id) for m in got)
    expected = sorted([*batch.valid.values(), *(("original", c) for c in batch.consumed)])
    leaked = [(m.kind, m.message_id, m.headers) for m in got if m.message_id in batch.bad]
    assert not leaked, f"the app got bad messages: {leaked}"
    assert delivered == expected, f"the app got {delivered}, expected {expected}"
    moved = {props.message_id: props for props, _ in invalid}
    not_moved = {
        message_id: (message.headers, message.body[:80])
        for message_id, message in batch.bad.items()
        if message_id not in moved
    }
    assert not not_moved, f"bad messages not on the invalid queue: {not_moved}"
    assert all((props.headers or {}).get(protocol.H_REASON) for props in moved.values())
    rig.consumed += batch.consumed


@INTEGRATION
@given(data=st.data())
def test_a_receiver_takes_valid_originals_among_poison(rig: Rig, data: st.DataObject) -> None:
    check_batch(rig, publish_batch(rig, data, controls=False))


@INTEGRATION
@given(data=st.data())
def test_a_receiver_with_the_secret_takes_only_signed_control_messages(
    rig: Rig, data: st.DataObject
) -> None:
    check_batch(rig, publish_batch(rig, data, controls=True))
