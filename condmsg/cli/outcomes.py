"""``condmsg outcomes --sender NAME``: a sender's outcomes as JSON lines.

Without ``--follow``, the CMs of that sender decided in its store (``--since`` an
instant), oldest decision first: a read that changes nothing. With ``--follow``, the
notifications as they arrive on the sender's outcome queue (CMs and Dependency-Spheres
alike), each acknowledged once printed: the queue's consumer takes them away from any
other consumer of that queue, so follow only a sender whose application does not read
its outcome queue itself. Exit codes: 0 done, 2 a usage or configuration error.
"""

from __future__ import annotations

import argparse
import json
import signal
from typing import Any

import sqlalchemy as sa

from condmsg.cli.options import add_amqp_url, add_db_url, amqp_url, named_db_url
from condmsg.errors import ConfigError
from condmsg.timeutil import parse_cli_instant


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "outcomes",
        help="a sender's outcomes as JSON lines: decided CMs from its store, or --follow",
        description="Print a sender's outcomes as JSON lines. Exit codes: 0 done, 2 a usage "
        "or configuration error.",
    )
    parser.add_argument("--sender", required=True, metavar="NAME", help="the sender identity")
    parser.add_argument(
        "--follow",
        action="store_true",
        help="consume the sender's outcome queue (CMs and spheres) instead of reading the store",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="with --follow: stop after this long without an outcome (default: never)",
    )
    parser.add_argument(
        "--since",
        type=parse_cli_instant,
        metavar="INSTANT",
        help="without --follow: CMs decided at or after this ISO 8601 instant (UTC if no offset)",
    )
    add_db_url(parser, "the sender store")
    add_amqp_url(parser)
    parser.set_defaults(handler=run, schema_store="sender")


def run(args: argparse.Namespace) -> int:
    if args.follow and args.since is not None:
        raise ConfigError("--since reads the store: leave out --follow")
    if not args.follow and args.timeout is not None:
        raise ConfigError("--timeout is for --follow")
    if args.timeout is not None and args.timeout <= 0:
        raise ConfigError("--timeout must be positive")
    if args.follow:
        return _follow(args)
    return _decided(args)


def _emit(document: dict[str, Any]) -> None:
    print(json.dumps(document, separators=(",", ":")), flush=True)


def _follow(args: argparse.Namespace) -> int:
    from condmsg.amqp import connect
    from condmsg.sender import Sender
    from condmsg.settings import Settings

    broker = amqp_url(args)
    # Said now, in one line, rather than logged by the sender and then raised again.
    connect(broker, name=f"condmsg-outcomes-{args.sender}").close()
    sender = Sender(
        name=args.sender,
        amqp_url=broker,
        db_url=named_db_url(args, existing=True),
        secret=Settings.from_env().secret,
    )
    # SIGTERM ends it as Ctrl-C does (exit 130); the notification being printed is not
    # acknowledged yet and stays on the queue.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        for outcome in sender.outcomes(timeout=args.timeout):
            _emit(outcome.to_dict())
    finally:
        sender.engine.dispose()
    return 0


def _decided(args: argparse.Namespace) -> int:
    from condmsg import sender_tables
    from condmsg.db import make_engine
    from condmsg.outcome import Outcome

    cms = sender_tables.cms
    query = (
        sa.select(cms)
        .where(cms.c.sender == args.sender, cms.c.state != sender_tables.CmState.PENDING.value)
        .order_by(cms.c.decided_at, cms.c.cm_id)
    )
    if args.since is not None:
        query = query.where(cms.c.decided_at >= args.since)
    engine = make_engine(named_db_url(args, existing=True))
    try:
        with engine.connect() as conn:
            for row in conn.execute(query):
                _emit(Outcome.from_row(row).to_dict())
    finally:
        engine.dispose()
    return 0
