"""The URLs a user gives condmsg, checked before anything connects: a database URL must name
a database a condmsg store lives in, a broker URL must be an AMQP URL. Each refusal is a
:class:`ConfigError` in one line that names the expected form."""

from __future__ import annotations

from urllib.parse import urlsplit

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from condmsg.core.errors import ConfigError
from condmsg.runtime.amqp import describe_url
from condmsg.runtime.db import describe_db_url

#: The URL schemes of the databases a condmsg store lives in (SQLAlchemy backend names).
DATABASES = ("postgresql", "sqlite")
#: The URL schemes of RabbitMQ.
AMQP_SCHEMES = ("amqp", "amqps")


def checked_amqp_url(url: str) -> str:
    """``url``, or :class:`ConfigError` if it is not an AMQP URL (pika would take
    ``http://x`` for a broker at x:5672 and fail later with a less useful message)."""
    scheme = urlsplit(url).scheme
    if scheme not in AMQP_SCHEMES:
        raise ConfigError(
            f"not an AMQP URL: {describe_url(url)}; RabbitMQ's URLs start with amqp:// or "
            "amqps://, e.g. amqp://user:password@host:5672/%2F"
        )
    return url


def checked_db_url(url: str) -> str:
    """``url``, or :class:`ConfigError` if it does not name a database condmsg stores in
    (SQLAlchemy would look for the driver of any other and fail on its import)."""
    try:
        backend = make_url(url).get_backend_name()
    except sa.exc.ArgumentError:
        raise ConfigError(
            f"bad database URL {describe_db_url(url)}: expected "
            "postgresql+psycopg://user@host/db or sqlite:///path.db"
        ) from None
    if backend not in DATABASES:
        raise ConfigError(
            f"unsupported database scheme {backend!r} in {describe_db_url(url)}; condmsg "
            "stores are PostgreSQL (postgresql+psycopg://user@host/db) or SQLite "
            "(sqlite:///path.db)"
        )
    return url
