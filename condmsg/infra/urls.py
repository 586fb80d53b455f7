"""Broker addresses: one AMQP URL or several (a cluster's nodes), shown without passwords."""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import unquote_plus, urlsplit

#: Query options that carry a credential: libpq's ``password`` and ``sslpassword`` (which
#: SQLAlchemy and psycopg pass on from a URL's query string), and the names other clients
#: use for the same thing. Matched case-insensitively.
CREDENTIAL_QUERY_KEYS = frozenset(
    {"password", "sslpassword", "pass", "passwd", "pwd", "secret", "token", "access_token"}
)

#: What a masked credential reads as.
MASK = "***"


def redact_url(url: str) -> str:
    """Return ``url`` with every credential masked: the password of its user info
    (``amqp://guest:***@host/``) and the value of every credential query option
    (``?password=***``, ``?sslpassword=***``, see :data:`CREDENTIAL_QUERY_KEYS`); every
    address of a comma-separated list of AMQP URLs is redacted.

    This is the one function that turns a URL into text for a person: logs, the CLI, the
    console and metrics labels all print URLs through it.
    """
    if "," in url and "://" in url.split(",", 1)[1]:
        return ",".join(redact_url(u) for u in split_urls(url))
    try:
        parts = urlsplit(url)
        password = parts.password
        port = parts.port
    except ValueError:
        return "<unparseable url>"
    out = url
    if password is not None:
        # String surgery rather than urlunsplit, which would shorten ``sqlite:///x``.
        user = parts.username or ""
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        if port is not None:
            host = f"{host}:{port}"
        out = out.replace(f"//{parts.netloc}", f"//{user}:{MASK}@{host}", 1)
    if parts.query:
        head, _, rest = out.partition("?")
        query, hash_, fragment = rest.partition("#")
        out = f"{head}?{_redact_query(query)}{hash_}{fragment}"
    return out


def _redact_query(query: str) -> str:
    """``query`` with the value of every credential option replaced by :data:`MASK`,
    everything else byte for byte as it was."""
    fields = []
    for field in query.split("&"):
        key, eq, _value = field.partition("=")
        if eq and unquote_plus(key).strip().lower() in CREDENTIAL_QUERY_KEYS:
            field = f"{key}={MASK}"
        fields.append(field)
    return "&".join(fields)


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
