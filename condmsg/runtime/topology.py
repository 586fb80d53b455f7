"""Queues condmsg declares, and how.

Destination queues are of the type a deployment chooses (``CONDMSG_DESTINATION_QUEUE_TYPE``):

- ``classic`` (the default): durable classic queues with ``x-max-priority`` so that
  compensations (priority 10) overtake an unread original. They live on one node.
- ``quorum``: durable quorum queues, replicated over a cluster's nodes. RabbitMQ 3.x quorum
  queues have no message priorities (and refuse ``x-max-priority``): a compensation then
  queues behind an unread original, and the receiver's RLOG still gives the paper's
  outcome (the app gets the original, then its compensation). RabbitMQ 4 quorum queues
  always have two priority levels (above 4 is high), so compensations overtake again.

The type is always declared explicitly (``x-queue-type``), so a broker whose default queue
type is quorum (RabbitMQ 4's ``default_queue_type``) still gets the type the setting names.

A queue that already exists with other arguments makes RabbitMQ close the declaring channel
with PRECONDITION_FAILED, so each declaration runs on a throwaway channel. A queue of the
other type is a deployment error, reported as one :class:`ConfigError` that names the queue
and the setting; a classic queue an application declared without priorities is used as it
is.

The sender's ack and outcome queues and the dead-letter queues are quorum queues: they need
no priorities, are consumed with ``basic_consume``, and quorum queues replicate and outran
classic ones on this kind of machine (see shared/BASELINES.md).
"""

from __future__ import annotations

import re

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from condmsg.core.conditions import QUEUE_MAX_PRIORITY
from condmsg.core.errors import ConfigError
from condmsg.runtime.amqp import connected_address, server_version
from condmsg.runtime.settings import DEFAULT_QUEUE_TYPE, ENV_DESTINATION_QUEUE_TYPE, QUEUE_TYPES

QUORUM = {"x-queue-type": "quorum"}
#: The first RabbitMQ release whose quorum queues carry message priorities.
QUORUM_PRIORITIES_SINCE = (4,)

PRECONDITION_FAILED = 406
_CURRENT_TYPE = re.compile(r"inequivalent arg 'x-queue-type'.*current is (?:the value )?'(\w+)'")


def destination_arguments(queue_type: str) -> dict[str, object]:
    """The ``queue.declare`` arguments of a destination queue of ``queue_type``."""
    if queue_type == "quorum":
        return dict(QUORUM)
    if queue_type == "classic":
        return {"x-queue-type": "classic", "x-max-priority": QUEUE_MAX_PRIORITY}
    raise ConfigError(
        f"{ENV_DESTINATION_QUEUE_TYPE} must be one of {', '.join(QUEUE_TYPES)}, got {queue_type!r}"
    )


def declare_destination(
    connection: pika.BlockingConnection, name: str, queue_type: str = DEFAULT_QUEUE_TYPE
) -> None:
    """Ensure a destination queue of ``queue_type`` exists; :class:`ConfigError` if it
    exists with the other type."""
    arguments = destination_arguments(queue_type)
    channel = connection.channel()
    try:
        channel.queue_declare(name, durable=True, arguments=arguments)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code != PRECONDITION_FAILED:
            raise
        text = str(exc.reply_text)
        if "x-queue-type" in text or (queue_type == "quorum" and "x-max-priority" in text):
            # A quorum declaration over a classic queue with priorities is refused for
            # its x-max-priority before its type is compared.
            found = _CURRENT_TYPE.search(text)
            current = found.group(1) if found else "classic"
            raise ConfigError(
                f"destination queue {name!r} exists as a {current} queue, but "
                f"{ENV_DESTINATION_QUEUE_TYPE} is {queue_type}: RabbitMQ cannot change a "
                f"queue's type; set {ENV_DESTINATION_QUEUE_TYPE}={current} for this "
                "deployment, or move the queue (drain it, delete it, let condmsg declare "
                "it again: docs/operations.md, 'Moving destination queues to quorum')"
            ) from None
        return  # a classic queue declared without priorities: use it as it is
    channel.close()


def describe_mode(connection: pika.BlockingConnection, queue_type: str) -> str:
    """One line for the log: the broker, its version and the destination queues in effect."""
    version = server_version(connection)
    shown = ".".join(map(str, version)) or "of unknown version"
    if queue_type == "classic":
        mode = "classic destination queues with priorities (not replicated)"
    elif version >= QUORUM_PRIORITIES_SINCE:
        mode = "quorum destination queues with two priority levels (compensations high)"
    else:
        mode = (
            "quorum destination queues without priorities (RabbitMQ before 4): a "
            "compensation follows an unread original and the receiver's log cancels them"
        )
    return f"RabbitMQ {shown} at {connected_address(connection)}: {mode}"


def declare_service_queue(channel: BlockingChannel, name: str) -> None:
    """A durable quorum queue for acks, outcomes and dead letters."""
    channel.queue_declare(name, durable=True, arguments=dict(QUORUM))
