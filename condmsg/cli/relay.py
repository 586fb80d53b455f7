"""``condmsg relay``: run the outbox relay as a service, or print the outbox status.

Settings come from the environment (``CONDMSG_DB_URL``, ``CONDMSG_AMQP_URL``). SIGTERM and
SIGINT stop the relay gracefully: no new claims, confirms in flight are awaited, rows
settled, connections closed (exit 0). ``--status`` prints the backlog and exits. Exit
codes: :mod:`condmsg.runtime.exit_codes`.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from types import FrameType
from typing import Any

import sqlalchemy as sa

import outbox
from condmsg.cli.options import add_amqp_url, add_db_url, amqp_url, named_db_url
from condmsg.infra.backoff import Backoff
from condmsg.runtime import migrate
from condmsg.runtime.amqp import describe_url
from condmsg.runtime.db import describe_db_url
from condmsg.runtime.exit_codes import INTERRUPTED, OK, USAGE, add_command
from condmsg.runtime.logging_setup import add_logging_arguments, configure_logging, log_banner
from condmsg.runtime.ops_server import serve_ops
from condmsg.runtime.stopping import StopSignals

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "relay",
        help="publish outbox rows to RabbitMQ (CONDMSG_DB_URL -> CONDMSG_AMQP_URL)",
        description="A service: publish a store's outbox rows to RabbitMQ with publisher "
        "confirms until SIGTERM or SIGINT, waiting for the database and the broker while "
        "they are away. With --status, print the backlog and exit.",
    )
    add_db_url(parser, "the store whose outbox to publish")
    add_amqp_url(parser)
    parser.add_argument("--status", action="store_true", help="print the outbox status, exit")
    parser.add_argument(
        "--table",
        metavar="NAME",
        default=outbox.DEFAULT_TABLE_NAME,
        help="outbox table name (default: %(default)s)",
    )
    parser.add_argument("--create-tables", action="store_true", help="create the table first")
    parser.add_argument(
        "--batch-size",
        type=int,
        metavar="N",
        default=500,
        help="rows per claim (default: %(default)s)",
    )
    parser.add_argument(
        "--batches-in-flight",
        type=int,
        metavar="N",
        default=4,
        help="batches awaiting confirms at once (default: %(default)s)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve /metrics (Prometheus), /healthz and /readyz on this port (0.0.0.0; "
        "default: none)",
    )
    add_logging_arguments(parser)
    parser.set_defaults(handler=run)


def _print_status(store: outbox.OutboxStore) -> None:
    status = store.status()
    age = status.oldest_pending_age_s
    print(f"table:              {store.table.name}")
    print(f"pending:            {status.pending}")
    print(f"failed:             {status.failed}")
    print(f"oldest pending age: {'-' if age is None else f'{age:.3f} s'}")
    for row in store.failed_rows(limit=10):
        print(f"  failed #{row.id} ({row.exchange!r}, {row.routing_key!r}): {row.last_error}")


def _check_schema(engine: sa.Engine) -> None:
    """Refuse an outbox that is missing, behind or ahead (one line naming the fix). An
    unversioned one that ``outbox.create_tables`` made (the outbox used as a library, outside
    a condmsg store) is served as it is. A database that cannot be reached yet is left to
    the relay, which waits for it."""
    try:
        if migrate.status(engine, "outbox").revision is None and sa.inspect(engine).has_table(
            outbox.DEFAULT_TABLE_NAME
        ):
            return
        migrate.check(engine, "outbox")
    except (sa.exc.OperationalError, sa.exc.InterfaceError):
        return


def _create_tables(engine: sa.Engine, table: str) -> bool:
    """Create the outbox table, waiting with backoff while the database is unreachable (a
    relay started during a database outage waits for it, as the running relay does);
    False if SIGTERM or SIGINT came meanwhile (noticed through a flag, never by
    interrupting a connection attempt halfway)."""
    stop = StopSignals().install()
    retries = Backoff(0.5, 30.0, stop=stop.event)
    try:
        while not stop.requested:
            try:
                if table == outbox.DEFAULT_TABLE_NAME:
                    migrate.ensure(engine, "outbox", create=True)  # versioned, as db upgrade
                else:
                    outbox.create_tables(engine, table_name=table)
                return True
            except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
                reason = str(exc.orig if exc.orig is not None else exc).strip().splitlines()[0]
                log.warning(
                    "waiting for the database at %s: %s; retrying in %.1fs",
                    describe_db_url(engine.url),
                    reason,
                    retries.upcoming_s,
                )
                retries.wait()
        return False
    finally:
        stop.uninstall()


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, args.log_format)
    db_url = named_db_url(args, existing=not args.create_tables)
    engine = sa.create_engine(db_url, pool_size=args.batches_in_flight + 2)
    try:
        if args.create_tables and not _create_tables(engine, args.table):
            return INTERRUPTED
        if args.table == outbox.DEFAULT_TABLE_NAME:
            _check_schema(engine)
        store = outbox.OutboxStore(engine, table_name=args.table)
        if args.status:
            _print_status(store)
            return OK
        config = outbox.RelayConfig.from_env(
            amqp_url=amqp_url(args),
            table_name=args.table,
            batch_size=args.batch_size,
            max_batches_in_flight=args.batches_in_flight,
        )
        relay = outbox.Relay(engine, config)
        log_banner(
            log,
            "relay",
            {
                "table": args.table,
                "store": describe_db_url(engine.url),
                "broker": describe_url(config.amqp_url),
                "consumes": "-",
                "writes": "the exchanges and queues its rows name",
                "metrics_port": args.metrics_port if args.metrics_port is not None else "-",
            },
        )
        server = serve_ops(
            relay.registry, args.metrics_port, live=relay.liveness, ready=relay.readiness
        )

        def _stop(signum: int, _frame: FrameType | None) -> None:
            # Only a flag: see condmsg.runtime.stopping for why a handler takes no lock.
            relay.request_stop()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        log.info("relay started on table %s", args.table)
        try:
            relay.run()
        finally:
            if server is not None:
                server.stop()
        if relay.fatal is not None:
            # Only refused credentials end it: configuration, which no restart mends.
            log.error("the relay stops: %s", relay.fatal)
            return USAGE
        log.info("relay stopped")
        return OK
    except outbox.CondmsgError as exc:
        print(f"condmsg relay: {exc}", file=sys.stderr)
        return USAGE
    except sa.exc.ArgumentError as exc:
        print(f"condmsg relay: bad CONDMSG_DB_URL: {exc}", file=sys.stderr)
        return USAGE
    finally:
        engine.dispose()
