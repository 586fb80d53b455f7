"""Opening RabbitMQ connections, with errors a user can act on.

pika's ``BlockingConnection`` is not thread-safe: every component (sender, receiver, relay,
evaluator) opens its own connection and uses it from one thread only.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pika
import pika.exceptions

from condmsg.errors import BrokerAuthError, BrokerError


def describe_url(url: str) -> str:
    """``amqp://host:port/vhost`` without credentials (for messages and logs)."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    return f"{parts.scheme or 'amqp'}://{host}:{port}{parts.path or '/'}"


def broker_reason(exc: BaseException) -> str:
    """The broker's own words in a refused connection (``NOT_ALLOWED - vhost x not
    found``), which pika nests in its error's text; else that text."""
    text = str(exc)
    found = re.search(r"'([A-Z_]+ - [^']*)'", text)
    return found.group(1) if found else text.splitlines()[0] if text else type(exc).__name__


def connect(url: str, *, name: str = "condmsg", heartbeat: int = 30) -> pika.BlockingConnection:
    """A blocking connection to ``url``; raises :class:`BrokerError` if it cannot be had."""
    try:
        params = pika.URLParameters(url)
    except Exception as exc:  # pika raises a variety of errors for malformed URLs
        raise BrokerError(f"invalid AMQP URL {describe_url(url)}: {exc}") from None
    params.heartbeat = heartbeat
    params.blocked_connection_timeout = 60
    params.connection_attempts = 1
    params.client_properties = {"connection_name": name}
    try:
        return pika.BlockingConnection(params)
    except pika.exceptions.ProbableAuthenticationError:
        raise BrokerAuthError(
            f"RabbitMQ at {describe_url(url)} refused the credentials; check the user and "
            "password in the AMQP URL"
        ) from None
    except pika.exceptions.ProbableAccessDeniedError as exc:
        raise BrokerAuthError(
            f"RabbitMQ at {describe_url(url)} denied access to the virtual host "
            f"({broker_reason(exc)}); check the vhost in the AMQP URL and the user's "
            "permissions on it"
        ) from None
    except pika.exceptions.AMQPConnectionError as exc:
        raise BrokerError(
            f"cannot reach RabbitMQ at {describe_url(url)}: {exc.__class__.__name__}; "
            "is the broker running? (rabbitmq-server -detached)"
        ) from None
    except Exception as exc:
        # While the network fails, pika lets other errors through from a socket that
        # broke mid-handshake (a ValueError from getpeername(), an OSError): still a
        # failed attempt that a retry may mend, never a reason for a service to end.
        raise BrokerError(
            f"cannot reach RabbitMQ at {describe_url(url)}: {type(exc).__name__}: {exc}"
        ) from exc
