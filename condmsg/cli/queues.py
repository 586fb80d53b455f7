"""Queues a command reads but must not create: a passive declare says whether one exists
without declaring it (reading a mistyped name would create a new, durable, empty queue
and wait on it for ever)."""

from __future__ import annotations

from condmsg.core.errors import ConfigError
from condmsg.runtime.amqp import connect, describe_url
from condmsg.runtime.topology import queue_exists


def require_queue(url: str, queue: str, hint: str) -> None:
    """:class:`ConfigError` naming ``queue`` and ``hint`` (what declares it) unless the
    queue exists at the broker ``url``."""
    connection = connect(url, name="condmsg-queue-check")
    try:
        if not queue_exists(connection, queue):
            raise ConfigError(f"queue {queue!r} does not exist at {describe_url(url)}; {hint}")
    finally:
        if connection.is_open:
            connection.close()
