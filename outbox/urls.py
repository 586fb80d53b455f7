"""Show connection URLs without their passwords."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def redact_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***`` (``amqp://guest:***@host/``)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def broker_address(url: str) -> str:
    """``amqp://host:port`` of an AMQP URL: what error messages name (no user, no vhost)."""
    try:
        parts = urlsplit(url)
        port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    except ValueError:
        return "<unparseable url>"
    return f"{parts.scheme or 'amqp'}://{parts.hostname or 'localhost'}:{port}"
