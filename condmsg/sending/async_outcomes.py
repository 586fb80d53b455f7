"""The outcome notifications of a sender's outcome queue as an async iterator
(``AsyncSender.outcomes``), on aio-pika: the sync stream's semantics
(:mod:`condmsg.sending.outcomes`), the same decoding, and the same pause on an outage.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiormq.exceptions
from aio_pika.abc import AbstractConnection, AbstractIncomingMessage, AbstractQueue

from condmsg.core import protocol
from condmsg.core.errors import BrokerAuthError, BrokerError
from condmsg.core.outcome import Outcome, SphereOutcome
from condmsg.infra.backoff import Backoff
from condmsg.runtime.pausing import FIRST_RETRY_S, MAX_RETRY_S, Pause
from condmsg.runtime.topology import outcome_queue_arguments
from condmsg.sending.async_broker import CONNECTION_ERRORS, connect
from condmsg.sending.outcomes import OUTCOMES_LOG, decode_outcome

#: How many notifications the broker hands over before the first is acknowledged.
PREFETCH = 100


async def async_outcome_notifications(
    amqp_url: str, sender: str, timeout: float | None
) -> AsyncIterator[Outcome | SphereOutcome]:
    """The documents of ``sender``'s outcome queue as they arrive, each acknowledged once
    the loop asks for the next; see :meth:`~condmsg.sending.sender.Sender.outcomes`."""
    pause = Pause(OUTCOMES_LOG, f"reading the outcomes of {sender!r}", "RabbitMQ")
    backoff = Backoff(FIRST_RETRY_S, MAX_RETRY_S)
    quiet_since = time.monotonic()
    while True:
        try:
            connection = await connect(amqp_url, name=f"condmsg-outcomes-{sender}")
            try:
                inbox: asyncio.Queue[Any] = asyncio.Queue()
                # A lost connection ends the wait below at once, as an outage.
                connection.close_callbacks.add(_told_of_close(inbox))
                queue = await _outcome_queue(connection, sender)
                await queue.consume(inbox.put)
                pause.ended()
                backoff.reset()
                while True:
                    wait = None if timeout is None else timeout - (time.monotonic() - quiet_since)
                    try:
                        item = await asyncio.wait_for(inbox.get(), wait)
                    except TimeoutError:
                        return
                    if isinstance(item, BaseException):
                        raise item
                    message: AbstractIncomingMessage = item
                    decoded = decode_outcome(message, message.body)
                    if decoded is not None:
                        yield decoded
                    quiet_since = time.monotonic()
                    # Acked once handed over (or found undecodable: told in the log, and
                    # not redelivered for ever in front of the valid ones).
                    await message.ack()
            finally:
                if not connection.is_closed:
                    await connection.close()
        except BrokerAuthError:
            raise
        except (BrokerError, *CONNECTION_ERRORS) as exc:
            if timeout is not None and time.monotonic() - quiet_since >= timeout:
                raise
            pause.failed(exc)
            await asyncio.sleep(backoff.next_delay())


def _told_of_close(inbox: asyncio.Queue[Any]) -> Callable[[object, BaseException | None], None]:
    """A close callback that puts the connection's end into ``inbox``."""

    def closed(_connection: object, exc: BaseException | None) -> None:
        inbox.put_nowait(exc or BrokerError("the connection to RabbitMQ closed"))

    return closed


async def _outcome_queue(connection: AbstractConnection, sender: str) -> AbstractQueue:
    """The outcome queue, declared (or, declared already with other arguments by an earlier
    release, used as it is, as the sync stream does)."""
    name = protocol.outcome_queue(sender)
    channel = await connection.channel()
    try:
        queue = await channel.declare_queue(name, durable=True, arguments=outcome_queue_arguments())
    except aiormq.exceptions.ChannelPreconditionFailed as exc:
        OUTCOMES_LOG.warning("outcome queue %s is used as it is: %s", name, exc)
        channel = await connection.channel()
        queue = await channel.get_queue(name, ensure=True)
    await channel.set_qos(prefetch_count=PREFETCH)
    return queue
