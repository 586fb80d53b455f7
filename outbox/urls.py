"""Broker addresses: one AMQP URL or several (a cluster's nodes), shown without passwords."""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit, urlunsplit


def redact_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***`` (``amqp://guest:***@host/``);
    every address of a comma-separated list of AMQP URLs is redacted."""
    if "," in url and "://" in url.split(",", 1)[1]:
        return ",".join(redact_url(u) for u in split_urls(url))
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
    """``amqp://host:port`` of an AMQP URL: what error messages name (no user, no vhost);
    of a comma-separated list, each address, joined by ``", "``."""
    if "," in url:
        return ", ".join(broker_address(u) for u in split_urls(url))
    try:
        parts = urlsplit(url)
        port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    except ValueError:
        return "<unparseable url>"
    return f"{parts.scheme or 'amqp'}://{parts.hostname or 'localhost'}:{port}"


def split_urls(urls: str | Sequence[str]) -> list[str]:
    """The broker addresses of a setting: a comma-separated string (``CONDMSG_AMQP_URL``)
    or a sequence of URLs, in the order they are to be tried; blanks are ignored.

    Commas never occur unescaped inside an AMQP URL (RFC 3986 reserves them and pika's
    query options take none), so a comma always separates two addresses.
    """
    items = urls.split(",") if isinstance(urls, str) else [u for s in urls for u in s.split(",")]
    found = [u.strip() for u in items if u.strip()]
    if not found:
        raise ValueError(
            "no broker address given: expected one AMQP URL or several, comma-separated"
        )
    return found


def join_urls(urls: str | Sequence[str]) -> str:
    """The comma-separated form of :func:`split_urls` (what a ``str`` setting holds)."""
    return ",".join(split_urls(urls))
