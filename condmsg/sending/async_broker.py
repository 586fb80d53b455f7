"""The async sender's side of RabbitMQ, on aio-pika: connecting without blocking the event
loop, and declaring the queues a send needs, once each.

The declarations carry the arguments :mod:`condmsg.runtime.topology` defines for the sync
sender (destination queues of the configured type, quorum service queues, the outcome
queue's TTL). They are best effort, as there: a broker that is down, or a queue that exists
with other arguments, is told in the log and the send goes on; the outbox keeps the copies
until the relay can publish them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import aio_pika
import aiormq.exceptions
from aio_pika.abc import AbstractChannel, AbstractConnection

from condmsg.core import protocol
from condmsg.core.errors import BrokerAuthError, BrokerError
from condmsg.infra.urls import split_urls
from condmsg.runtime.amqp import describe_url
from condmsg.runtime.topology import QUORUM, destination_arguments, outcome_queue_arguments

log = logging.getLogger(__name__)

#: What aio-pika and aiormq raise for a broker that cannot be had or went away.
CONNECTION_ERRORS = (aiormq.exceptions.AMQPError, ConnectionError, OSError)


async def connect(url: str, *, name: str) -> AbstractConnection:
    """A connection to the first of the addresses in ``url`` that answers;
    :class:`BrokerAuthError` for refused credentials, else :class:`BrokerError`."""
    last: BaseException | None = None
    for one in split_urls(url):
        try:
            return await aio_pika.connect(one, client_properties={"connection_name": name})
        except aiormq.exceptions.ProbableAuthenticationError:
            raise BrokerAuthError(
                f"RabbitMQ at {describe_url(one)} refused the credentials; check the user "
                "and password in the AMQP URL"
            ) from None
        except CONNECTION_ERRORS as exc:
            last = exc
    raise BrokerError(
        f"cannot reach RabbitMQ at {describe_url(url)}: {last}; is the broker running?"
    ) from None


class AsyncDeclarer:
    """Declares a sender's queues over one aio-pika connection, opened when first needed
    and kept; each destination queue once per process."""

    def __init__(self, amqp_url: str, sender: str, queue_type: str) -> None:
        self._url = amqp_url
        self._sender = sender
        self._queue_type = queue_type
        self._connection: AbstractConnection | None = None
        self.declared: set[str] = set()

    async def service_queues(self) -> None:
        """The sender's ack, dead-letter and outcome queues."""
        quorum: dict[str, Any] = dict(QUORUM)
        await self._declare(
            [
                (protocol.ack_queue(self._sender), quorum),
                (protocol.dead_letter_queue(self._sender), quorum),
                (protocol.outcome_queue(self._sender), outcome_queue_arguments()),
            ]
        )

    async def destinations(self, queues: Iterable[str]) -> None:
        """The destination queues among ``queues`` not declared yet."""
        missing = [q for q in queues if q not in self.declared]
        if missing:
            arguments: dict[str, Any] = destination_arguments(self._queue_type)
            await self._declare([(q, arguments) for q in missing])

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None and not connection.is_closed:
            await connection.close()

    async def _declare(self, queues: list[tuple[str, dict[str, Any]]]) -> None:
        try:
            if self._connection is None or self._connection.is_closed:
                self._connection = await connect(self._url, name=f"condmsg-sender-{self._sender}")
            for name, arguments in queues:
                # A refused declaration closes its channel: one channel per queue.
                channel: AbstractChannel = await self._connection.channel()
                try:
                    await channel.declare_queue(name, durable=True, arguments=arguments)
                    self.declared.add(name)
                except aiormq.exceptions.ChannelPreconditionFailed as exc:
                    log.warning("queue %s is used as it is: %s", name, exc)
                    self.declared.add(name)
                finally:
                    if not channel.is_closed:
                        await channel.close()
        except (BrokerError, *CONNECTION_ERRORS) as exc:
            log.warning("queues not declared now: %s", exc)
