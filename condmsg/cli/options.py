"""Options every command reads the same way: ``--db-url`` and ``--amqp-url``, each with its
environment variable as the fallback and said so in ``--help``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from urllib.parse import urlsplit

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from condmsg.amqp import describe_url
from condmsg.db import describe_db_url
from condmsg.errors import ConfigError
from condmsg.settings import DEFAULT_AMQP_URL, ENV_AMQP_URL, ENV_DB_URL, Settings


def add_db_url(parser: argparse.ArgumentParser, what: str = "the store", *, also: str = "") -> None:
    """``--db-url URL``: the SQLAlchemy URL of ``what``; ``also`` extends the fallback."""
    fallback = f"${ENV_DB_URL}{also}"
    parser.add_argument(
        "--db-url", metavar="URL", help=f"SQLAlchemy URL of {what} (default: {fallback})"
    )


def add_create_schema(parser: argparse.ArgumentParser, store: str) -> None:
    """``--create-schema``: create the store if it does not exist yet (else the command
    refuses a missing store and names ``condmsg db upgrade``)."""
    parser.add_argument(
        "--create-schema",
        action="store_true",
        help=f"create the {store} store if it does not exist yet (quick starts; else run "
        f"condmsg db upgrade --store {store})",
    )


def add_amqp_url(parser: argparse.ArgumentParser) -> None:
    """``--amqp-url URL``: the broker, else ``CONDMSG_AMQP_URL``, else the local one."""
    parser.add_argument(
        "--amqp-url",
        metavar="URL",
        # argparse %-formats help: the vhost's %2F must be doubled.
        help=f"RabbitMQ (default: ${ENV_AMQP_URL}, else "
        f"{describe_url(DEFAULT_AMQP_URL).replace('%', '%%')} as guest)",
    )


#: The URL schemes of the databases a condmsg store lives in (SQLAlchemy backend names).
DATABASES = ("postgresql", "sqlite")
#: The URL schemes of RabbitMQ.
AMQP_SCHEMES = ("amqp", "amqps")


def amqp_url(args: argparse.Namespace) -> str:
    """The broker the user named, else the environment's, else the local development one
    (a default broker creates nothing, unlike a default database file)."""
    return checked_amqp_url(str(getattr(args, "amqp_url", None) or Settings.from_env().amqp_url))


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


def given_db_url(args: argparse.Namespace) -> str | None:
    """``--db-url``, else ``CONDMSG_DB_URL``, else None (for messages about a failure)."""
    return getattr(args, "db_url", None) or os.environ.get(ENV_DB_URL) or None


def named_db_url(args: argparse.Namespace, *, existing: bool = False) -> str:
    """The database the user named: ``--db-url``, else ``CONDMSG_DB_URL``. A command never
    picks one by itself (a default SQLite file would appear in whatever directory it ran
    in). With ``existing``, a SQLite file must already be there: a command that only reads
    a store must not create an empty one."""
    url = given_db_url(args)
    if not url:
        raise ConfigError(f"name the database: --db-url or {ENV_DB_URL}")
    checked_db_url(url)
    if existing:
        parsed = make_url(str(url))
        path = parsed.database
        sqlite_file = parsed.get_backend_name() == "sqlite" and path and path != ":memory:"
        if sqlite_file and not Path(str(path)).exists():
            raise ConfigError(f"no store at {path} (a SQLite file that does not exist)")
    return str(url)
