"""Queues condmsg declares, and how.

Destination queues are classic, durable queues with ``x-max-priority`` so compensations
(priority 10) overtake an unread original. A queue that already exists is used as it is:
declaring it again with other arguments makes RabbitMQ close that channel with
PRECONDITION_FAILED, which here means "it exists, leave it", so each declaration runs on a
throwaway channel.

The sender's ack and outcome queues and the dead-letter queues are quorum queues: they need
no priorities, are consumed with ``basic_consume``, and quorum queues replicate and outran
classic ones on this kind of machine (see shared/BASELINES.md).
"""

from __future__ import annotations

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from condmsg.conditions import QUEUE_MAX_PRIORITY

QUORUM = {"x-queue-type": "quorum"}


PRECONDITION_FAILED = 406


def declare_destination(connection: pika.BlockingConnection, name: str) -> None:
    """Ensure a destination queue exists (durable, priorities up to 10) unless it does."""
    channel = connection.channel()
    try:
        channel.queue_declare(name, durable=True, arguments={"x-max-priority": QUEUE_MAX_PRIORITY})
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code != PRECONDITION_FAILED:
            raise
        return  # it exists with arguments of its own: use it as it is
    channel.close()


def declare_service_queue(channel: BlockingChannel, name: str) -> None:
    """A durable quorum queue for acks, outcomes and dead letters."""
    channel.queue_declare(name, durable=True, arguments=dict(QUORUM))
