"""Queues a command reads but must not create: a passive declare says whether one exists
without declaring it (reading a mistyped name would create a new, durable, empty queue
and wait on it for ever)."""

from __future__ import annotations

import pika.exceptions

from condmsg.core.errors import ConfigError
from condmsg.runtime.amqp import connect, describe_url


def require_queue(url: str, queue: str, hint: str) -> None:
    """:class:`ConfigError` naming ``queue`` and ``hint`` (what declares it) unless the
    queue exists at the broker ``url``."""
    connection = connect(url, name="condmsg-queue-check")
    try:
        try:
            connection.channel().queue_declare(queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != 404:
                raise
            raise ConfigError(
                f"queue {queue!r} does not exist at {describe_url(url)}; {hint}"
            ) from None
    finally:
        if connection.is_open:
            connection.close()
