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

The outcome queue is bounded by a message TTL (:data:`OUTCOME_TTL`): many applications
never read it (they ask ``Sender.outcome(id)``, which reads the store), and a queue nobody
reads would otherwise grow for ever. A notification that expires is dropped, and nothing
is lost with it: the store keeps every outcome. A TTL rather than a length limit because a
length limit drops the oldest notifications during a burst, also ones a live consumer is
about to read, and ``reject-publish`` would turn a full queue into parked outbox rows.
"""

from __future__ import annotations

import logging
import re
from datetime import timedelta
from typing import Any

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from condmsg.core.conditions import QUEUE_MAX_PRIORITY
from condmsg.core.errors import ConfigError
from condmsg.runtime.amqp import connected_address, server_version
from condmsg.runtime.settings import DEFAULT_QUEUE_TYPE, ENV_DESTINATION_QUEUE_TYPE, QUEUE_TYPES

log = logging.getLogger(__name__)

QUORUM = {"x-queue-type": "quorum"}
#: How long a notification waits on an outcome queue before RabbitMQ drops it. A policy
#: with ``message-ttl`` (or ``max-length``) bounds it further without a redeclaration
#: (the lower TTL wins): docs/sending.md, "The outcome queue".
OUTCOME_TTL = timedelta(days=7)
#: The longest sender name: its queue names (``condmsg.<sender>.outcome``) must fit
#: RabbitMQ's 255 bytes.
MAX_SENDER_BYTES = 255 - len("condmsg..outcome")
#: The first RabbitMQ release whose quorum queues carry message priorities.
QUORUM_PRIORITIES_SINCE = (4,)

PRECONDITION_FAILED = 406
NOT_FOUND = 404
_CURRENT_TTL = re.compile(
    r"inequivalent arg 'x-message-ttl'.*current is (?:the value '(\d+)'|none)"
)
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


def queue_exists(connection: pika.BlockingConnection, name: str) -> bool:
    """Whether the queue ``name`` exists, asked without declaring it (a passive declare,
    on a channel of its own: a missing queue closes the channel that asked)."""
    channel = connection.channel()
    try:
        channel.queue_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code != NOT_FOUND:
            raise
        return False
    channel.close()
    return True


def outcome_queue_arguments() -> dict[str, Any]:
    """The outcome queue's ``queue.declare`` arguments (quorum, notifications kept
    :data:`OUTCOME_TTL`), for the sync and the async sender alike."""
    return dict(QUORUM, **{"x-message-ttl": int(OUTCOME_TTL.total_seconds() * 1000)})


def declare_outcome_queue(connection: pika.BlockingConnection, name: str) -> None:
    """A sender's outcome queue: a service queue whose notifications expire after
    :data:`OUTCOME_TTL`. One that exists with another TTL, or none (declared by an earlier
    release), is used as it is, with a warning that says how to bound it: RabbitMQ refuses
    to change a queue's arguments, and refusing to start would stop the outcomes too."""
    channel = connection.channel()  # a refused declaration closes the channel
    arguments = outcome_queue_arguments()
    try:
        channel.queue_declare(name, durable=True, arguments=arguments)
    except pika.exceptions.ChannelClosedByBroker as exc:
        found = _CURRENT_TTL.search(str(exc.reply_text))
        if exc.reply_code != PRECONDITION_FAILED or found is None:
            raise
        log.warning(
            "outcome queue %s exists with %s, not %d ms, and RabbitMQ cannot "
            "change it: it is used as it is. To bound it now, set a policy (rabbitmqctl "
            "set_policy --apply-to queues condmsg-outcomes '^condmsg\\..+\\.outcome$' "
            "'{\"message-ttl\":%d}'), or delete it while no one reads it and condmsg "
            "declares it again (docs/sending.md, 'The outcome queue')",
            name,
            f"message TTL {found.group(1)} ms" if found.group(1) else "no message TTL",
            arguments["x-message-ttl"],
            arguments["x-message-ttl"],
        )
        return
    channel.close()


def checked_sender_name(name: str) -> str:
    """``name``, or :class:`ConfigError` if it cannot name a sender's queues: empty, with
    white space or control characters (queues named so are legal in RabbitMQ and a trap
    for every shell and URL that names them), or too long for RabbitMQ."""
    if not name or any(c.isspace() or not c.isprintable() for c in name):
        raise ConfigError(
            f"bad sender name {name!r}: use letters, digits and . _ - (no spaces); its "
            "queues are named condmsg.<sender>.ack and .outcome"
        )
    if len(name.encode()) > MAX_SENDER_BYTES:
        raise ConfigError(f"bad sender name: longer than {MAX_SENDER_BYTES} bytes")
    return name
