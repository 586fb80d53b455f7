"""A receiver given the deployment secret refuses an
unsigned or wrongly signed compensation or success notice to its invalid queue, with a
reason naming the token; the app never sees it. A correctly signed one is delivered.

The messages are built by hand, from the recipe in docs/protocol.md: the token of a
compensation or notice is a hex HMAC-SHA256, keyed by the deployment
secret, over ``"\\x1f".join([kind, cm_id, destination, recipient or "", sha256(body)])``.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pika
import pytest

from condmsg.core import protocol
from condmsg.core.protocol import control_token
from tests.integration.condmsg_helpers import SECRET, get_all, publish_original, receiver_queue
from tests.waiting import wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

UNDO = b"undo the booking"


def _control(
    channel: Any,
    queue: str,
    cm_id: str,
    kind: protocol.MessageKind,
    *,
    body: bytes = UNDO,
    token: str | None = None,
) -> None:
    """Publish a compensation or success notice as the relay would, with ``token``."""
    headers: dict[str, Any] = {
        protocol.H_VERSION: protocol.PROTOCOL_VERSION,
        protocol.H_KIND: kind.value,
        protocol.H_CM_ID: cm_id,
        protocol.H_DESTINATION: queue,
        protocol.H_SENDER: "s",
        protocol.H_SENT_AT: protocol.format_instant(datetime.now(UTC)),
    }
    if token is not None:
        headers[protocol.H_TOKEN] = token
    channel.basic_publish(
        "",
        queue,
        body,
        pika.BasicProperties(
            message_id=f"{cm_id}.{queue}.{kind.value}",
            correlation_id=cm_id,
            content_type="application/octet-stream",
            headers=headers,
            delivery_mode=2,
        ),
    )


def _consumed_original(receiver: Any, channel: Any, queue: str) -> str:
    cm_id = publish_original(channel, queue, body=b"book it")
    with receiver.transaction() as tx:
        original = wait_for(lambda: tx.read(queue, timeout=0.5))
        assert (original.kind, original.cm_id) == (protocol.MessageKind.ORIGINAL, cm_id)
    return cm_id


def _signed(kind: protocol.MessageKind, cm_id: str, queue: str, body: bytes = UNDO) -> str:
    return control_token(SECRET, kind.value, cm_id, queue, None, body)


@pytest.fixture
def setup(db_url: str, unique_name: str, make_receiver: Any) -> tuple[Any, str]:
    receiver = make_receiver(db_url, secret=SECRET)
    return receiver, receiver_queue(receiver, unique_name)


def _refused(receiver: Any, channel: Any, queue: str) -> str:
    """Nothing reaches the app; the one message is on the invalid queue: its reason."""
    with receiver.transaction() as tx:
        assert tx.read(queue, timeout=1.0) is None
    moved = get_all(channel, receiver.invalid_queue)
    assert len(moved) == 1
    assert receiver.stats.invalid == 1
    reason = str(moved[0][0].headers[protocol.H_REASON])
    assert "token" in reason, reason
    return reason


def test_an_unsigned_compensation_is_refused(setup: Any, channel: Any) -> None:
    receiver, queue = setup
    cm_id = _consumed_original(receiver, channel, queue)
    _control(channel, queue, cm_id, protocol.MessageKind.COMPENSATION)
    _refused(receiver, channel, queue)


def test_a_compensation_with_a_wrong_token_is_refused(setup: Any, channel: Any) -> None:
    receiver, queue = setup
    cm_id = _consumed_original(receiver, channel, queue)
    forged = control_token(b"not the secret", "compensation", cm_id, queue, None, UNDO)
    _control(channel, queue, cm_id, protocol.MessageKind.COMPENSATION, token=forged)
    _refused(receiver, channel, queue)


def test_a_compensation_signed_for_another_body_is_refused(setup: Any, channel: Any) -> None:
    receiver, queue = setup
    cm_id = _consumed_original(receiver, channel, queue)
    token = _signed(protocol.MessageKind.COMPENSATION, cm_id, queue, b"something else")
    _control(channel, queue, cm_id, protocol.MessageKind.COMPENSATION, token=token)
    _refused(receiver, channel, queue)


def test_an_unsigned_success_notice_is_refused(setup: Any, channel: Any) -> None:
    receiver, queue = setup
    cm_id = _consumed_original(receiver, channel, queue)
    _control(channel, queue, cm_id, protocol.MessageKind.SUCCESS, body=b"done")
    _refused(receiver, channel, queue)


def test_a_refused_compensation_is_refused_on_every_read_path(setup: Any, channel: Any) -> None:
    """Plain reads and consume judge as transactional reads do."""
    receiver, queue = setup
    cm_id = _consumed_original(receiver, channel, queue)
    _control(channel, queue, cm_id, protocol.MessageKind.COMPENSATION)
    _control(channel, queue, cm_id, protocol.MessageKind.SUCCESS, body=b"done")
    assert receiver.read(queue, timeout=1.0) is None
    seen: list[Any] = []
    _control(channel, queue, cm_id, protocol.MessageKind.COMPENSATION)
    assert receiver.consume(queue, lambda m, s: seen.append(m), idle_timeout_s=1.0) == 0
    assert seen == []
    moved = get_all(channel, receiver.invalid_queue)
    assert len(moved) == 3
    assert receiver.stats.invalid == 3


def test_a_correctly_signed_compensation_and_notice_are_delivered(setup: Any, channel: Any) -> None:
    receiver, queue = setup
    cm_id = _consumed_original(receiver, channel, queue)
    token = _signed(protocol.MessageKind.COMPENSATION, cm_id, queue)
    _control(channel, queue, cm_id, protocol.MessageKind.COMPENSATION, token=token)
    with receiver.transaction() as tx:
        compensation = wait_for(lambda: tx.read(queue, timeout=0.5))
        assert (compensation.kind, compensation.cm_id, compensation.payload) == (
            protocol.MessageKind.COMPENSATION,
            cm_id,
            UNDO,
        )
    other = str(uuid.uuid4())
    token = _signed(protocol.MessageKind.SUCCESS, other, queue, b"done")
    _control(channel, queue, other, protocol.MessageKind.SUCCESS, body=b"done", token=token)
    notice = wait_for(lambda: receiver.read(queue, timeout=0.5))
    assert (notice.kind, notice.cm_id) == (protocol.MessageKind.SUCCESS, other)
    assert get_all(channel, receiver.invalid_queue, settle_s=0.1) == []
    assert receiver.stats.invalid == 0
