"""``condmsg check-services``: log in to RabbitMQ and open the database, as the services will.

Each check does what a service does at start, so a pass means the services can start: it
logs in to RabbitMQ with the URL's credentials and virtual host, opens the named database
and runs a query, and (with ``--store``) checks that store's schema revision and (with
``--sender``) that the sender's service queues exist. Each failure is one line naming what
failed and what to do. Exit codes: :mod:`condmsg.runtime.exit_codes`.

``make test`` and ``make demo`` run it first, so a stopped service produces one clear
message naming the command that starts it instead of a wall of connection errors.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import pika.exceptions
import sqlalchemy as sa

import outbox
from ackd.ack_watch import STALE_AFTER_S
from condmsg.cli.failures import database_problem
from condmsg.cli.options import add_amqp_url, add_db_url, amqp_url
from condmsg.core import protocol
from condmsg.core.errors import CondmsgError
from condmsg.core.wording import plural
from condmsg.runtime import migrate
from condmsg.runtime.amqp import connect, describe_url
from condmsg.runtime.credentials import db_url_from_env
from condmsg.runtime.db import describe_db_url, require_existing_file
from condmsg.runtime.exit_codes import FAILED, OK, add_command
from condmsg.runtime.settings import ENV_TEST_PG_URL, Settings
from condmsg.runtime.url_checks import checked_db_url


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "check-services",
        help="log in to RabbitMQ and open the database, as the services do",
        description="Log in to RabbitMQ and open the database as the services do at start, so "
        "that a pass means they can start; with --store also check that store's schema "
        "revision, with --sender that the sender's queues exist. Each failure is one line.",
    )
    add_amqp_url(parser)
    add_db_url(parser, "the database", also=f", else ${ENV_TEST_PG_URL}, else the local PostgreSQL")
    parser.add_argument(
        "--store", choices=migrate.STORES, help="also check this store's schema revision"
    )
    parser.add_argument(
        "--sender", metavar="NAME", help="also check that this sender's service queues exist"
    )
    parser.set_defaults(handler=run)


def _broker(url: str, sender: str | None) -> str | None:
    try:
        connection = connect(url, name="condmsg-check-services")
    except CondmsgError as exc:  # its message names the fix (credentials, start the broker)
        return str(exc)
    try:
        if sender is not None:
            for queue in (protocol.ack_queue(sender), protocol.outcome_queue(sender)):
                channel = connection.channel()
                try:
                    channel.queue_declare(queue, passive=True)
                except pika.exceptions.ChannelClosedByBroker:
                    return (
                        f"queue {queue!r} does not exist at {describe_url(url)}; "
                        f"a sender or evaluator named {sender!r} declares it when it starts"
                    )
                channel.close()
    finally:
        if connection.is_open:
            connection.close()
    return None


def _database(url: str, store: str | None) -> str | None:
    try:
        engine = sa.create_engine(url)
    except (sa.exc.ArgumentError, ImportError) as exc:
        return f"bad database URL {describe_db_url(url)}: {exc}"
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
            if store is not None:
                migrate.check(conn, store)
        if store is not None:
            return _stuck_outbox(engine)
    except migrate.SchemaError as exc:
        return str(exc)
    except sa.exc.DBAPIError as exc:
        return database_problem(url, exc, store or "sender")
    finally:
        engine.dispose()
    return None


def _stuck_outbox(engine: sa.Engine) -> str | None:
    """A store whose outbox nobody publishes: its acks (or copies) never leave."""
    status = outbox.OutboxStore(engine).status()
    age = status.oldest_pending_age_s
    if age is None or age <= STALE_AFTER_S:
        return None
    return (
        f"{plural(status.pending, 'message')} {'has' if status.pending == 1 else 'have'} "
        f"waited up to {age:.0f} s in the outbox of "
        f"{describe_db_url(str(engine.url))}: no relay publishes this store (run condmsg "
        "relay --db-url with it, or the owner's start_relay())"
    )


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    amqp = amqp_url(args)
    db = checked_db_url(args.db_url or db_url_from_env() or settings.test_pg_url)
    require_existing_file(db)  # a check creates nothing, not even an empty SQLite file
    problems = [p for p in (_broker(amqp, args.sender), _database(db, args.store)) if p]
    for problem in problems:
        print(f"condmsg check-services: {problem}", file=sys.stderr)
    if not problems:
        print(f"RabbitMQ at {describe_url(amqp)} and the database at {describe_db_url(db)} answer.")
    return FAILED if problems else OK
