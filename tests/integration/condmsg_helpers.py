"""Helpers for the sender/receiver integration tests (real RabbitMQ, real databases)."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pika
import sqlalchemy as sa

from condmsg.core import protocol
from condmsg.core.acks import AckKind
from condmsg.core.conditions import Condition, Destination
from condmsg.core.protocol import AckMessage
from condmsg.sending.copies import notice_message, plan_copies
from outbox.message import OutboxMessage

SECRET = b"integration-test-secret-5b8d2e7f1a9c0346"


class Clock:
    """A settable clock for a service's ``clock``: returns ``at``."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at


def stepped_evaluator(sender: Any, clock: Clock, **options: Any) -> Any:
    """An evaluator of ``sender`` on its store and ``clock``, not started (no relay): a
    test calls its steps (``process_bodies``, ``sweep``, ``jobs.sweep_spheres``)."""
    from evaluator.config import EvaluatorConfig
    from evaluator.service import Evaluator

    config = EvaluatorConfig(
        amqp_url=sender.amqp_url, sender=sender.name, secret=SECRET, relay=False, **options
    )
    return Evaluator(config, engine=sender.engine, clock=clock)


def ack_body(
    cm_id: str, destination: str, at: datetime, *, receiver: str, **overrides: Any
) -> bytes:
    """A genuine READ ack document for the copy (its token signed with :data:`SECRET` for
    the ``recipient`` override, if any); ``overrides`` replace any other field."""
    fields: dict[str, Any] = {
        "ack_id": uuid.uuid4().hex,
        "cm_id": cm_id,
        "destination": destination,
        "kind": AckKind.READ,
        "read_at": at,
        "committed_at": None,
        "recipient": None,
        "receiver": receiver,
        "token": protocol.copy_token(SECRET, cm_id, destination, overrides.get("recipient")),
    }
    return protocol.AckMessage(**(fields | overrides)).to_json()


def get_all(channel: Any, queue: str, *, settle_s: float = 0.3) -> list[tuple[Any, bytes]]:
    """Everything in ``queue`` now, acked: waits until no message came for ``settle_s``."""
    found: list[tuple[Any, bytes]] = []
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < settle_s:
        method, props, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            time.sleep(0.02)
            continue
        found.append((props, body))
        quiet_since = time.monotonic()
    return found


def acks_in(channel: Any, sender: str) -> list[AckMessage]:
    return [AckMessage.from_json(body) for _, body in get_all(channel, protocol.ack_queue(sender))]


def publish_copy(
    channel: Any,
    *,
    cm_id: str,
    condition: Condition,
    sender: str,
    sent_at: datetime,
    body: bytes,
    content_type: str = "application/octet-stream",
    part_bytes: int = 1 << 20,
) -> None:
    """Publish the copies of a CM directly (as the relay would), for tests that need
    precise control over timing."""
    for plan in plan_copies(
        cm_id=cm_id,
        condition=condition,
        sender=sender,
        sent_at=sent_at,
        secret=SECRET,
        body=body,
        content_type=content_type,
        app_headers={},
        part_bytes=part_bytes,
    ):
        for message in plan.messages:
            publish(channel, message)


def publish(channel: Any, message: OutboxMessage) -> None:
    """Publish an outbox message directly (as the relay would)."""
    headers: dict[str, Any] = dict(message.headers or {})
    channel.basic_publish(
        message.exchange,
        message.routing_key,
        message.body,
        pika.BasicProperties(
            message_id=message.message_id,
            correlation_id=message.correlation_id,
            reply_to=message.reply_to,
            content_type=message.content_type,
            headers=headers,
            priority=message.priority,
            delivery_mode=2,
        ),
    )


def publish_compensation(
    channel: Any, *, queue: str, cm_id: str, destination: str, sender: str, body: bytes
) -> None:
    publish_notice(
        channel,
        protocol.MessageKind.COMPENSATION,
        queue=queue,
        cm_id=cm_id,
        destination=destination,
        sender=sender,
        body=body,
    )


def publish_notice(
    channel: Any,
    kind: protocol.MessageKind,
    *,
    queue: str,
    cm_id: str,
    destination: str,
    sender: str,
    body: bytes,
) -> None:
    """Publish a compensation or success notice (``kind``) for the copy of ``cm_id`` at
    ``destination`` to ``queue``, signed as the relay would send it."""
    publish(
        channel,
        notice_message(
            kind=kind,
            cm_id=cm_id,
            destination=destination,
            recipient=None,
            sender=sender,
            sent_at=datetime.now(UTC),
            exchange="",
            routing_key=queue,
            body=body,
            content_type="application/octet-stream",
            secret=SECRET,
        ),
    )


def publish_original(
    channel: Any,
    queue: str,
    cm_id: str | None = None,
    body: bytes = b"original",
    **options: Any,
) -> str:
    """Publish the copy of a CM of sender ``s`` for ``queue`` alone, sent now (``options``:
    those of :func:`copy_messages`); its CM id (``cm_id``, or a new one)."""
    cm_id = str(uuid.uuid4()) if cm_id is None else cm_id
    for message in copy_messages(queue, body, cm_id=cm_id, **options):
        publish(channel, message)
    return cm_id


def copy_messages(
    queue: str,
    body: bytes = b"original",
    *,
    cm_id: str | None = None,
    content_type: str = "application/octet-stream",
    part_bytes: int = 1 << 20,
    pickup_within: timedelta = timedelta(seconds=30),
) -> list[OutboxMessage]:
    """The outbox messages of the copy of a CM of sender ``s`` for ``queue`` alone, sent
    now (its parts, if ``body`` exceeds ``part_bytes``), signed with :data:`SECRET`."""
    (plan,) = plan_copies(
        cm_id=str(uuid.uuid4()) if cm_id is None else cm_id,
        condition=Destination(queue, pickup_within=pickup_within),
        sender="s",
        sent_at=datetime.now(UTC),
        secret=SECRET,
        body=body,
        content_type=content_type,
        app_headers={},
        part_bytes=part_bytes,
    )
    return list(plan.messages)


def sender_name(unique_name: str) -> str:
    """The name of the test's sender: its queues (``condmsg.<name>.ack`` and so on) are
    deleted after the test with the test's own."""
    return unique_name.replace(".", "-")


def receiver_queue(receiver: Any, unique_name: str) -> str:
    """The test's queue, declared as ``receiver`` declares its queues."""
    queue = f"{unique_name}.q"
    receiver._broker.ensure_queue(queue)
    return queue


def invalid_reasons(channel: Any, receiver: Any) -> list[str]:
    """The reasons of everything on ``receiver``'s invalid queue now (taken off it)."""
    return [
        str(props.headers[protocol.H_REASON])
        for props, _ in get_all(channel, receiver.invalid_queue)
    ]


#: The app's own table of the messages it handled, written in the receiver's transaction.
app_metadata = sa.MetaData()
handled_rows = sa.Table(
    "app_handled",
    app_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("cm_id", sa.String(36), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
)


def app_rows(engine: Any) -> list[tuple[str, str]]:
    """(cm_id, kind) of every message the app recorded in :data:`handled_rows`."""
    with engine.connect() as conn:
        return [(r.cm_id, r.kind) for r in conn.execute(sa.select(handled_rows))]
