"""The outcome notifications a sender reads from its outcome queue (``Sender.outcomes``).

The evaluator writes one document per decided CM (:class:`Outcome`) and per decided
Dependency-Sphere (:class:`SphereOutcome`), told apart by the AMQP type. A broker outage
pauses the stream (said once each way on this module's logger) rather than ending it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Iterator
from contextlib import closing
from typing import Any

import pika.exceptions

from condmsg.core import protocol
from condmsg.core.errors import BrokerAuthError, BrokerError, ProtocolError
from condmsg.core.outcome import SPHERE_OUTCOME_TYPE, Outcome, SphereOutcome
from condmsg.runtime.amqp import connect
from condmsg.runtime.pausing import Pause
from condmsg.runtime.topology import declare_outcome_queue

#: Where the stream says that it pauses for a broker outage and resumes.
OUTCOMES_LOG = logging.getLogger(__name__)
#: The longest single wait for an outcome notification (seconds).
OUTCOME_WAIT_S = 0.5


def outcome_notifications(
    amqp_url: str, sender: str, timeout: float | None
) -> Iterator[Outcome | SphereOutcome]:
    """The documents of ``sender``'s outcome queue as they arrive, each acknowledged once
    the loop asks for the next; see :meth:`~condmsg.sending.sender.Sender.outcomes`."""
    pause = Pause(OUTCOMES_LOG, f"reading the outcomes of {sender!r}", "RabbitMQ")
    quiet_since = time.monotonic()
    while True:
        try:
            with closing(_one_connection(amqp_url, sender, timeout)) as stream:
                for document in stream:
                    pause.ended()
                    yield document
                    quiet_since = time.monotonic()
            return
        except BrokerAuthError:
            raise
        except (BrokerError, pika.exceptions.AMQPError, OSError) as exc:
            if timeout is not None and time.monotonic() - quiet_since >= timeout:
                raise
            pause.failed(exc)
            pause.wait()


def _one_connection(
    amqp_url: str, sender: str, timeout: float | None
) -> Generator[Outcome | SphereOutcome, None, None]:
    """The documents of one connection to the outcome queue."""
    connection = connect(amqp_url, name=f"condmsg-outcomes-{sender}")
    try:
        declare_outcome_queue(connection, protocol.outcome_queue(sender))
        channel = connection.channel()
        channel.basic_qos(prefetch_count=100)
        # Short waits, the caller's timeout counted here: pika's blocking consume tells
        # of a lost connection only when a wait ends, not while it waits.
        last = time.monotonic()
        for method, props, body in channel.consume(
            protocol.outcome_queue(sender), inactivity_timeout=OUTCOME_WAIT_S
        ):
            if method is None:
                if timeout is not None and time.monotonic() - last >= timeout:
                    return
                continue
            last = time.monotonic()
            decoded = decode_outcome(props, body or b"")
            if decoded is not None:
                yield decoded
            # Acked once handed over (or found undecodable: told in the log, and not
            # redelivered for ever in front of the valid ones).
            channel.basic_ack(int(method.delivery_tag or 0))
    finally:
        if connection.is_open:
            connection.close()


def decode_outcome(props: Any, body: bytes) -> Outcome | SphereOutcome | None:
    """A document of the outcome queue, by its AMQP type; None (logged) if it does not
    decode: nothing the evaluator writes, so nothing to wait for."""
    try:
        if props is not None and props.type == SPHERE_OUTCOME_TYPE:
            return SphereOutcome.from_json(body)
        return Outcome.from_json(body)
    except ProtocolError as exc:
        OUTCOMES_LOG.warning("dropped an undecodable document from the outcome queue: %s", exc)
        return None
