"""The sender's dead-letter queue, looked at without taking anything from it.

The evaluator dead-letters an ack body it cannot decode to ``condmsg.<sender>.dead`` with
the reason in the ``condmsg-reason`` header; they live in RabbitMQ, not in the store. A
look takes up to ``limit`` messages with ``basic.get`` *without* acknowledging them and
then closes the channel, which gives every one of them back to the queue at its place
(RabbitMQ marks them redelivered; their order and content stay). The console looks only
when it was given a broker URL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from condmsg.core import protocol
from condmsg.runtime.amqp import broker_reason, connect

#: Body bytes of a dead letter the page shows (escaped, as text).
EXCERPT = 160


@dataclass(slots=True)
class DeadLetters:
    queue: str
    count: int | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    #: Why the queue could not be read (no such queue, no broker), if it could not.
    problem: str | None = None


def peek(amqp_url: str, sender: str, limit: int) -> DeadLetters:
    import pika

    queue = protocol.dead_letter_queue(sender)
    found = DeadLetters(queue)
    try:
        connection = connect(amqp_url, name="condmsg console")
    except Exception as exc:
        found.problem = broker_reason(exc)
        return found
    try:
        channel = connection.channel()
        try:
            found.count = channel.queue_declare(queue, passive=True).method.message_count
        except pika.exceptions.ChannelClosedByBroker as exc:
            found.problem = f"no queue {queue}: {exc.reply_text}"
            return found
        for _ in range(min(limit, found.count or 0)):
            method, props, body = channel.basic_get(queue, auto_ack=False)
            if method is None or props is None:
                break
            body = body or b""
            headers = props.headers or {}
            text = bytes(body[:EXCERPT]).decode("utf-8", "replace")
            found.messages.append(
                {
                    "reason": str(headers.get(protocol.H_REASON, "")),
                    "type": props.type,
                    "excerpt": text + ("…" if len(body) > EXCERPT else ""),
                }
            )
        channel.close()  # unacknowledged: every message goes back to the queue
    except pika.exceptions.AMQPError as exc:
        found.problem = broker_reason(exc)
    finally:
        if connection.is_open:
            connection.close()
    return found
