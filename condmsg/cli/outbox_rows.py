"""``condmsg outbox list|requeue|purge``: the parked rows of a store's outbox.

The relay parks a row it cannot publish (a missing exchange or queue, a message the broker
refuses, attempts exhausted) with the reason. ``list`` prints them as JSON lines;
``requeue`` makes them pending again, so the running relay publishes them (after the
cause is mended); ``purge`` deletes them, and asks for ``--yes``: what it deletes is gone.
Exit codes: :mod:`condmsg.runtime.exit_codes`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import sqlalchemy as sa

from condmsg.cli.options import add_db_url, named_db_url
from condmsg.core.errors import ConfigError
from condmsg.core.timeutil import stored_instant
from condmsg.core.wording import plural
from condmsg.runtime.exit_codes import FAILED, OK, add_command


def register(subparsers: Any) -> None:
    import outbox

    parser = add_command(
        subparsers,
        "outbox",
        help="list, requeue or purge the outbox rows the relay parked",
        description="The rows of a store's outbox the relay parked (failed): list prints them "
        "as JSON lines, requeue makes them pending again for the relay once the cause is "
        "mended, purge deletes them (with --yes).",
    )
    parser.add_argument("action", choices=("list", "requeue", "purge"))
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--ids", type=int, nargs="+", metavar="ID", help="these rows")
    chosen.add_argument("--all", action="store_true", help="every parked row")
    parser.add_argument("--yes", action="store_true", help="purge: yes, delete them")
    parser.add_argument(
        "--limit",
        type=int,
        metavar="N",
        default=1000,
        help="list: at most this many rows (default: %(default)s)",
    )
    parser.add_argument(
        "--table",
        metavar="NAME",
        default=outbox.DEFAULT_TABLE_NAME,
        help="the outbox table (default: %(default)s)",
    )
    add_db_url(parser, "the store whose outbox it is")
    parser.set_defaults(handler=run, schema_store="outbox")


def run(args: argparse.Namespace) -> int:
    import outbox
    from condmsg.runtime.db import describe_db_url, make_engine

    if args.action != "list" and not (args.ids or args.all):
        raise ConfigError(f"outbox {args.action}: name the rows with --ids ID... or --all")
    if args.action == "purge" and not args.yes:
        raise ConfigError("outbox purge deletes the rows for good: add --yes")
    url = named_db_url(args, existing=True)
    engine = make_engine(url)
    try:
        if not sa.inspect(engine).has_table(args.table):
            raise ConfigError(
                f"no outbox table {args.table!r} at {describe_db_url(url)}; is it the right "
                "store? (condmsg db upgrade --store outbox creates one)"
            )
        store = outbox.OutboxStore(engine, table_name=args.table)
        if args.action == "list":
            _list(store, args)
            return OK
        ids = None if args.all else sorted(set(args.ids))
        unparked = None if ids is None else _not_parked(store, ids)
        if args.action == "requeue":
            done = store.requeue_failed(ids)
            print(
                f"requeued {plural(done, 'parked row')}; the relay publishes them again"
                if done
                else "requeued nothing"
            )
        else:
            done = store.delete_failed(ids)
            print(f"deleted {plural(done, 'parked row')}" if done else "deleted nothing")
    finally:
        engine.dispose()
    if unparked is not None:
        print(f"condmsg outbox: {unparked}; see condmsg outbox list", file=sys.stderr)
        return FAILED
    return OK


def _not_parked(store: Any, ids: list[int]) -> str | None:
    """What is wrong with the rows ``ids`` that are not parked (no such row, or pending:
    the relay has them), or None if every one is parked."""
    from outbox.table import FAILED as PARKED

    t = store.table
    with store.engine.connect() as conn:
        states = dict(conn.execute(sa.select(t.c.id, t.c.state).where(t.c.id.in_(ids))).all())
    missing = [i for i in ids if i not in states]
    pending = [i for i in ids if i in states and states[i] != PARKED]
    count = len(missing) + len(pending)
    if not count:
        return None
    verb = "is" if count == 1 else "are"
    what = []
    if missing:
        what.append(f"no such row: {', '.join(map(str, missing))}")
    if pending:
        what.append(f"pending, not parked: {', '.join(map(str, pending))}")
    return f"{count} of the rows named {verb} not parked ({'; '.join(what)})"


def _list(store: Any, args: argparse.Namespace) -> None:
    """One JSON line per parked row, oldest first (with ``--ids``, those rows only)."""
    from outbox.table import FAILED

    t = store.table
    query = (
        sa.select(
            t.c.id,
            t.c.exchange,
            t.c.routing_key,
            t.c.attempts,
            t.c.last_error,
            t.c.created_at,
            t.c.failed_at,
        )
        .where(t.c.state == FAILED)
        .order_by(t.c.id)
        .limit(args.limit)
    )
    if args.ids:
        query = query.where(t.c.id.in_(args.ids))
    with store.engine.connect() as conn:
        for row in conn.execute(query):
            exchange = f"{row.exchange}/" if row.exchange else ""
            document = {
                "id": row.id,
                "destination": f"{exchange}{row.routing_key}",
                "exchange": row.exchange,
                "routing_key": row.routing_key,
                "reason": row.last_error,
                "attempts": row.attempts,
                "created": _instant(row.created_at),
                "parked": _instant(row.failed_at),
            }
            print(json.dumps(document, separators=(",", ":")))


def _instant(value: Any) -> str | None:
    return None if value is None else stored_instant(value).isoformat()
