"""The sender's dead letters, shown without taking anything from the dead-letter queue.

The evaluator dead-letters an ack body it cannot decode or store to
``condmsg.<sender>.dead`` (a quorum queue) with the reason in the ``condmsg-reason``
header, and in the same transaction records it as a ``malformed`` anomaly: its reason, its
size and the start of its body. The console lists those rows and asks RabbitMQ only for the
queue's depth (a passive ``queue.declare``, which touches no message).

It never reads the queue itself. RabbitMQ has no browse: a ``basic.get`` given back (by
``basic.nack`` with requeue or by closing the channel) counts as a delivery on a quorum
queue, and once a message's count passes the queue's ``x-delivery-limit`` (a queue argument
or a ``delivery-limit`` policy) RabbitMQ drops it or dead-letters it onwards. A page
refreshed a few times would have emptied the queue it shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import sqlalchemy as sa

from condmsg import tables
from condmsg.core import protocol
from condmsg.runtime.amqp import broker_reason, connect


@dataclass(frozen=True, slots=True)
class DeadLetter:
    #: When the evaluator dead-lettered it (UTC).
    recorded_at: datetime
    #: ``REASON; body (N bytes): START OF THE BODY``, as the evaluator recorded it.
    detail: str


@dataclass(slots=True)
class DeadLetters:
    queue: str
    #: Messages in the queue now; None without a broker URL or when it could not be asked.
    count: int | None = None
    #: The latest dead letters the store recorded, newest first.
    recorded: list[DeadLetter] = field(default_factory=list)
    #: Why the queue's depth is unknown (no such queue, no broker), if it is.
    problem: str | None = None


def recorded(conn: sa.Connection, limit: int) -> list[DeadLetter]:
    """The ``limit`` latest dead letters of the store, newest first."""
    anomalies = tables.anomalies
    rows = conn.execute(
        sa.select(anomalies.c.recorded_at, anomalies.c.detail)
        .where(anomalies.c.kind == tables.AnomalyKind.MALFORMED.value)
        .order_by(anomalies.c.id.desc())
        .limit(limit)
    )
    return [DeadLetter(row.recorded_at, row.detail) for row in rows]


def depth(amqp_url: str, sender: str) -> tuple[int | None, str | None]:
    """How many messages ``condmsg.<sender>.dead`` holds, or None and why not."""
    import pika

    queue = protocol.dead_letter_queue(sender)
    try:
        connection = connect(amqp_url, name="condmsg console")
    except Exception as exc:
        return None, broker_reason(exc)
    try:
        declared = connection.channel().queue_declare(queue, passive=True)
        return int(declared.method.message_count), None
    except pika.exceptions.ChannelClosedByBroker as exc:
        return None, f"no queue {queue}: {exc.reply_text}"
    except pika.exceptions.AMQPError as exc:
        return None, broker_reason(exc)
    finally:
        if connection.is_open:
            connection.close()
