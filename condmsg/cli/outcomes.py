"""``condmsg outcomes --sender NAME``: a sender's outcomes as JSON lines.

Without ``--follow``, the CMs of that sender decided in its store (``--since`` an
instant), oldest decision first: a read that changes nothing. With ``--follow``, the
notifications as they arrive on the sender's outcome queue (CMs and Dependency-Spheres
alike), each acknowledged once printed: the queue's consumer takes them away from any
other consumer of that queue, so follow only a sender whose application does not read
its outcome queue itself; a sender whose outcome queue does not exist is refused (a
mistyped name would otherwise create its queues). Exit codes: :mod:`condmsg.runtime.exit_codes`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from condmsg.cli.options import add_amqp_url, add_db_url, amqp_url, named_db_url, stderr_log
from condmsg.core.errors import ConfigError
from condmsg.core.timeutil import parse_cli_instant
from condmsg.runtime.exit_codes import OK, add_command

if TYPE_CHECKING:
    from condmsg.sending.sender import Sender


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "outcomes",
        help="a sender's outcomes as JSON lines: decided CMs from its store, or --follow",
        description="Print a sender's outcomes as JSON lines: the CMs decided in its store, "
        "or with --follow the notifications on its outcome queue as they arrive (each "
        "acknowledged once printed, so follow only a sender whose application does not read "
        "that queue itself).",
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
    from condmsg.runtime.topology import checked_sender_name

    checked_sender_name(args.sender)
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
    from condmsg.cli.queues import require_queue
    from condmsg.core.protocol import outcome_queue
    from condmsg.runtime.settings import Settings
    from condmsg.sending.sender import Sender

    broker = amqp_url(args)
    queue = outcome_queue(args.sender)
    # Before the sender, which declares its queues: a mistyped name must create nothing.
    require_queue(
        broker,
        queue,
        f"is {args.sender!r} the sender's name? (its queues exist once it or its evaluator "
        "has started)",
    )
    sender = Sender(
        name=args.sender,
        amqp_url=broker,
        db_url=named_db_url(args, existing=True),
        secret=Settings.from_env().secret,
    )
    # SIGTERM ends it as Ctrl-C does (condmsg.cli.main): exit 130; the notification being
    # printed is not acknowledged yet and stays on the queue.
    stops = "Ctrl-C to stop"
    if args.timeout is not None:
        stops = f"until {args.timeout:g} s pass without one; {stops}"
    print(
        f"condmsg outcomes: waiting for outcomes on {queue} ({stops})", file=sys.stderr, flush=True
    )
    try:
        _print_outcomes(sender, args.timeout)
    finally:
        sender.engine.dispose()
    return OK


def _print_outcomes(sender: Sender, timeout: float | None) -> None:
    """Print the notifications as they come until ``timeout`` passes without one. A
    broker that goes away pauses the stream until it answers again (``Sender.outcomes``),
    which the command says on stderr each way."""
    from condmsg.sending.outcomes import OUTCOMES_LOG

    stderr_log("outcomes", OUTCOMES_LOG.name)
    for outcome in sender.outcomes(timeout=timeout):
        _emit(outcome.to_dict())


def _decided(args: argparse.Namespace) -> int:
    from condmsg import tables
    from condmsg.core.outcome import Outcome
    from condmsg.runtime.db import describe_db_url, make_engine
    from evaluator.store_setup import another_sender

    cms = tables.cms
    query = (
        sa.select(cms)
        .where(cms.c.sender == args.sender, cms.c.state != tables.CmState.PENDING.value)
        .order_by(cms.c.decided_at, cms.c.cm_id)
    )
    if args.since is not None:
        query = query.where(cms.c.decided_at >= args.since)
    engine = make_engine(named_db_url(args, existing=True))
    try:
        with engine.connect() as conn:
            other = another_sender(conn, args.sender)
            if other is not None:
                raise ConfigError(
                    f"no CMs of sender {args.sender!r} in {describe_db_url(str(engine.url))}, "
                    f"which holds CMs of {other!r}; check --sender"
                )
            for row in conn.execute(query):
                _emit(Outcome.from_row(row).to_dict())
    finally:
        engine.dispose()
    return OK
