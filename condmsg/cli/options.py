"""Options every command reads the same way: ``--db-url`` and ``--amqp-url``, each with its
environment variable as the fallback and said so in ``--help``."""

from __future__ import annotations

import argparse
import logging
import sys

from condmsg.core.errors import ConfigError
from condmsg.runtime.amqp import describe_url
from condmsg.runtime.credentials import db_url_from_env
from condmsg.runtime.db import require_existing_file
from condmsg.runtime.settings import DEFAULT_AMQP_URL, ENV_AMQP_URL, ENV_DB_URL, Settings
from condmsg.runtime.url_checks import checked_amqp_url, checked_db_url


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


def amqp_url(args: argparse.Namespace) -> str:
    """The broker the user named, else the environment's, else the local development one
    (a default broker creates nothing, unlike a default database file)."""
    return checked_amqp_url(str(getattr(args, "amqp_url", None) or Settings.from_env().amqp_url))


def given_db_url(args: argparse.Namespace) -> str | None:
    """``--db-url``, else ``CONDMSG_DB_URL``, else None (for messages about a failure)."""
    return getattr(args, "db_url", None) or db_url_from_env() or None


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
        require_existing_file(url)
    return str(url)


def stderr_log(command: str, name: str | None = None) -> logging.Logger:
    """The logger ``name`` (by default one of the command's own) made to say, on stderr
    and in the command's words (``condmsg <command>: ...``), that work pauses for an
    outage and when it resumes: the command configures no logging of its own."""
    log = logging.getLogger(name or f"condmsg.cli.{command}.said")
    if not any(isinstance(h, _Stderr) for h in log.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter(f"condmsg {command}: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    return log


class _Stderr(logging.Handler):
    """Writes to whatever ``sys.stderr`` is when a line is said (a handler made at import
    would keep the stream of that moment)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), file=sys.stderr, flush=True)
        except Exception:
            self.handleError(record)
