"""Opening RabbitMQ connections, with errors a user can act on.

pika's ``BlockingConnection`` is not thread-safe: every component (sender, receiver, relay,
evaluator) opens its own connection and uses it from one thread only.

A setting may name several brokers (the nodes of a cluster): a comma-separated
``CONDMSG_AMQP_URL`` or a sequence of URLs. :func:`connect` tries them in order and returns
the first connection that opens, so a component that reconnects after losing its node lands
on a node that answers. Each attempt is bounded (socket and handshake timeouts), so a node
that is down, or a host that does not answer at all, never holds a component for long.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from urllib.parse import urlsplit

import pika
import pika.exceptions

from condmsg.core.errors import BrokerAuthError, BrokerError
from condmsg.infra.urls import split_urls

log = logging.getLogger(__name__)

#: Seconds one address may take to accept the TCP connection / to finish the AMQP handshake.
SOCKET_TIMEOUT_S = 5.0
HANDSHAKE_TIMEOUT_S = 10.0


def describe_url(url: str | Sequence[str]) -> str:
    """``amqp://host:port/vhost`` without credentials (for messages and logs); every address
    of a list, joined by ``", "``."""
    try:
        urls = split_urls(url)
    except ValueError:
        return "<no broker address>"
    if len(urls) > 1:
        return ", ".join(describe_url(u) for u in urls)
    parts = urlsplit(urls[0])
    host = parts.hostname or "localhost"
    port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    return f"{parts.scheme or 'amqp'}://{host}:{port}{parts.path or '/'}"


def broker_reason(exc: BaseException) -> str:
    """The broker's own words in a refused connection (``NOT_ALLOWED - vhost x not
    found``), which pika nests in its error's text; else that text."""
    text = str(exc)
    found = re.search(r"'([A-Z_]+ - [^']*)'", text)
    return found.group(1) if found else text.splitlines()[0] if text else type(exc).__name__


def connect(
    url: str | Sequence[str], *, name: str = "condmsg", heartbeat: int = 30
) -> pika.BlockingConnection:
    """A blocking connection to the first of the addresses in ``url`` that answers (see the
    module docstring); raises :class:`BrokerError` if none can be had."""
    try:
        urls = split_urls(url)
        params = [pika.URLParameters(u) for u in urls]
    except Exception as exc:  # pika raises a variety of errors for malformed URLs
        raise BrokerError(f"invalid AMQP URL {describe_url(url)}: {exc}") from None
    for one in params:
        one.heartbeat = heartbeat
        one.blocked_connection_timeout = 60
        one.connection_attempts = 1
        one.retry_delay = 0
        one.socket_timeout = SOCKET_TIMEOUT_S
        one.stack_timeout = HANDSHAKE_TIMEOUT_S
        one.client_properties = {"connection_name": name}
    where = describe_url(urls)
    try:
        # Given a sequence, pika tries each parameter set in order and raises the last
        # failure when none opened.
        connection = pika.BlockingConnection(params if len(params) > 1 else params[0])
    except pika.exceptions.ProbableAuthenticationError:
        raise BrokerAuthError(
            f"RabbitMQ at {where} refused the credentials; check the user and "
            "password in the AMQP URL"
        ) from None
    except pika.exceptions.ProbableAccessDeniedError as exc:
        raise BrokerAuthError(
            f"RabbitMQ at {where} denied access to the virtual host "
            f"({broker_reason(exc)}); check the vhost in the AMQP URL and the user's "
            "permissions on it"
        ) from None
    except pika.exceptions.AMQPConnectionError as exc:
        raise BrokerError(
            f"cannot reach RabbitMQ at {where}: {exc.__class__.__name__}; "
            "is the broker running? (rabbitmq-server -detached)"
        ) from None
    except Exception as exc:
        # While the network fails, pika lets other errors through from a socket that
        # broke mid-handshake (a ValueError from getpeername(), an OSError): still a
        # failed attempt that a retry may mend, never a reason for a service to end.
        raise BrokerError(f"cannot reach RabbitMQ at {where}: {type(exc).__name__}: {exc}") from exc
    if len(urls) > 1:
        log.debug("%s connected to %s", name, connected_address(connection))
    return connection


def connected_address(connection: pika.BlockingConnection) -> str:
    """``host:port`` of the node a connection reached."""
    params = connection._impl.params  # type: ignore[attr-defined]  # the parameters that opened it
    return f"{params.host}:{params.port}"


def server_version(connection: pika.BlockingConnection) -> tuple[int, ...]:
    """The broker's version from its ``server_properties`` (``(3, 10, 8)``; ``()`` if it
    gave none)."""
    raw = connection._impl.server_properties.get("version", b"")  # type: ignore[attr-defined]
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])
