"""What a command says when the world is not as it expects: one line naming what failed
and what to do about it.

The library translates most driver errors where they arise (:mod:`condmsg.runtime.amqp`, the
stores), but a command also meets them raw: SQLAlchemy's ``OperationalError`` carrying
psycopg's or sqlite3's message when it opens a database, pika's errors when a channel
fails, ``socket.gaierror`` when a broker's host name does not resolve, and ``OSError`` for
the files it reads. ``explain`` turns each into that one line; ``condmsg --debug`` shows
the traceback instead.
"""

from __future__ import annotations

import argparse
import socket

import pika.exceptions
import sqlalchemy as sa

from condmsg.cli.options import amqp_url, given_db_url
from condmsg.core.errors import CondmsgError
from condmsg.core.wording import first_line
from condmsg.runtime.amqp import broker_reason, describe_url
from condmsg.runtime.db import describe_db_url

START_POSTGRESQL = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"


def database_problem(url: str | None, exc: sa.exc.SQLAlchemyError, store: str) -> str:
    """One line for a database error met while using ``store`` at ``url``."""
    where = describe_db_url(url) if url else "the database"
    reason = first_line(exc)
    lowered = reason.lower()
    if isinstance(exc, sa.exc.ArgumentError):
        return f"bad database URL {where}: {reason}"
    if "no such table" in lowered or ("relation" in lowered and "does not exist" in lowered):
        return (
            f"the {store} store at {where} has no schema ({reason}); create it with: "
            f"condmsg db upgrade --store {store}"
        )
    if "refused" in lowered:
        hint = f"is PostgreSQL running? ({START_POSTGRESQL})"
    elif "database" in lowered and "does not exist" in lowered:
        hint = "create the database or name another one with --db-url"
    elif "role" in lowered or "password" in lowered or "authentication" in lowered:
        hint = "check the user and password in the database URL"
    elif "unable to open database file" in lowered:
        hint = "check that the SQLite file's directory exists and is writable"
    elif "resolve host" in lowered:
        hint = "check the host name in the database URL"
    else:
        hint = "check --db-url and that the database is up"
    return f"cannot use the database at {where}: {reason}; {hint}"


def explain(exc: BaseException, args: argparse.Namespace) -> str | None:
    """The line to print for ``exc``, or None if it is not one a user can act on (a bug:
    let its traceback through)."""
    store = str(getattr(args, "schema_store", None) or getattr(args, "store", None) or "sender")
    if isinstance(exc, CondmsgError):
        return str(exc)
    if isinstance(exc, sa.exc.SQLAlchemyError):
        return database_problem(given_db_url(args), exc, store)
    broker = describe_url(amqp_url(args))
    if isinstance(exc, pika.exceptions.ProbableAuthenticationError):
        return f"RabbitMQ at {broker} refused the credentials; check the user and password"
    if isinstance(exc, pika.exceptions.ProbableAccessDeniedError):
        return (
            f"RabbitMQ at {broker} refused access ({broker_reason(exc)}); check the virtual "
            "host and the user's permissions"
        )
    if isinstance(exc, pika.exceptions.AMQPError):
        return f"RabbitMQ at {broker} failed: {exc!r}; is the broker running?"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host of {broker} ({exc.strerror}); check --amqp-url"
    db_url = given_db_url(args)
    if isinstance(exc, ModuleNotFoundError) and db_url and exc.name and exc.name in db_url:
        return (
            f"the database URL {describe_db_url(db_url)} needs the driver {exc.name!r}, "
            "which is not installed; use postgresql+psycopg:// or sqlite:///"
        )
    if isinstance(exc, FileNotFoundError):
        return f"no such file: {exc.filename}"
    if isinstance(exc, IsADirectoryError):
        return f"a directory, not a file: {exc.filename}"
    if isinstance(exc, PermissionError):
        return f"permission denied: {exc.filename}; check the file's owner and mode"
    return None
