"""Command line of the evaluator service, shared by ``condmsg evaluator`` and ``python -m
evaluator``: run the service for one sender until SIGTERM/SIGINT. Exit codes:
:mod:`condmsg.runtime.exit_codes` (0 stopped by a signal, 2 a configuration error, which includes a
store without its schema and credentials RabbitMQ keeps refusing).

The service is imported when the command runs, so building the ``condmsg`` parser stays
cheap. The retention policy options are here too: ``condmsg retention`` takes the same.
"""

from __future__ import annotations

import argparse
import logging
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from condmsg.core.errors import ConfigError
from condmsg.runtime.credentials import db_url_from_env
from condmsg.runtime.db import describe_db_url, require_existing_file
from condmsg.runtime.logging_setup import add_logging_arguments, configure_logging, log_banner
from condmsg.runtime.settings import (
    ENV_AMQP_URL,
    ENV_ARCHIVE_DIR,
    ENV_DB_URL,
    ENV_RETENTION,
    ENV_RETENTION_INTERVAL_S,
    Settings,
    parse_duration,
)
from condmsg.runtime.stopping import StopSignals
from condmsg.runtime.url_checks import checked_amqp_url, checked_db_url

if TYPE_CHECKING:
    from evaluator.config import EvaluatorConfig
    from evaluator.service import Evaluator

HELP = "decide conditional messages of a sender (acks, timeouts, outcomes)"
DESCRIPTION = (
    "A service: consume a sender's acks (condmsg.<sender>.ack), decide its CMs on acks and "
    "deadlines, and publish outcomes, notices and compensations through the store's outbox "
    "(its own relay unless --no-relay), until SIGTERM or SIGINT. It waits for the database "
    "and the broker while they are away; a configuration error ends it."
)


def duration(text: str) -> timedelta:
    """An argparse ``type`` for durations such as ``7d`` (see :func:`parse_duration`)."""
    try:
        return parse_duration(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_policy_arguments(parser: argparse.ArgumentParser, period: str) -> None:
    """The retention period (option ``period``, stored as ``retention``) and ``--archive``."""
    parser.add_argument(
        period,
        dest="retention",
        type=duration,
        metavar="DURATION",
        help="archive, then delete, CMs decided longer ago than this, e.g. 7d "
        f"(default: {ENV_RETENTION}; unset: keep everything)",
    )
    parser.add_argument(
        "--archive",
        type=Path,
        metavar="DIR",
        help=f"where retention writes its Parquet archives (default: {ENV_ARCHIVE_DIR})",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sender", required=True, metavar="NAME", help="the sender name whose acks to consume"
    )
    parser.add_argument(
        "--db-url",
        metavar="URL",
        help=f"SQLAlchemy URL of the sender store (default: ${ENV_DB_URL}; one is required)",
    )
    parser.add_argument(
        "--amqp-url", metavar="URL", help=f"RabbitMQ (default: ${ENV_AMQP_URL}, else the local one)"
    )
    parser.add_argument(
        "--ack-grace-ms",
        type=int,
        metavar="MS",
        help="how long after a deadline acks still in a relay may arrive "
        "(default: CONDMSG_ACK_GRACE_MS or 250)",
    )
    parser.add_argument(
        "--create-schema",
        action="store_true",
        help="create the sender store if it does not exist yet (else: condmsg db upgrade)",
    )
    _add_throughput_arguments(parser)
    _add_monitoring_arguments(parser)
    add_logging_arguments(parser)
    parser.add_argument(
        "--no-relay", action="store_true", help="do not publish the outbox (run `condmsg relay`)"
    )
    add_policy_arguments(parser, "--retention")
    parser.add_argument(
        "--retention-interval",
        type=float,
        metavar="SECONDS",
        help=f"between retention passes (default: {ENV_RETENTION_INTERVAL_S} or 3600)",
    )


def _add_throughput_arguments(parser: argparse.ArgumentParser) -> None:
    """How the evaluator paces and spreads its work."""
    parser.add_argument(
        "--sweep-interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="longest wait between deadline sweeps, which also run when a CM falls due "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=500,
        metavar="N",
        help="acks taken in per batch, one transaction each (default: %(default)s)",
    )
    parser.add_argument(
        "--store-threads",
        type=int,
        default=2,
        metavar="N",
        help="threads that store and decide batches while the next is consumed "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--intake-processes",
        type=int,
        default=1,
        metavar="N",
        help="processes taking in acks (this one and N-1 workers; PostgreSQL only): one "
        "interpreter lock bounds a process's intake, so use up to one per core "
        "(default: %(default)s)",
    )


def _add_monitoring_arguments(parser: argparse.ArgumentParser) -> None:
    """What the evaluator tells its operators, and how often."""
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve /metrics (Prometheus), /healthz and /readyz on this port (0.0.0.0; "
        "default: none)",
    )
    parser.add_argument(
        "--gauge-interval",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="between refreshes of the pending-CM and ack-queue gauges (default: %(default)s)",
    )
    parser.add_argument(
        "--summary-interval",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="between INFO lines saying how many CMs were decided, are pending and are "
        "overdue (0: none; default: %(default)s)",
    )


def _config(args: argparse.Namespace) -> EvaluatorConfig:
    """The command line's settings over the environment's."""
    from evaluator.config import EvaluatorConfig

    # What the command line leaves out comes from the environment.
    given: dict[str, Any] = {
        name: value
        for name, value in [
            ("retention", args.retention),
            ("retention_archive", args.archive),
            ("retention_interval_s", args.retention_interval),
        ]
        if value
    }
    if args.ack_grace_ms is not None:
        given["ack_grace"] = timedelta(milliseconds=args.ack_grace_ms)
    # The store is named by the user, never guessed: a default SQLite file would appear in
    # whatever directory the service was started in.
    db_url = args.db_url or db_url_from_env()
    if not db_url:
        raise ConfigError(f"name the sender's store: --db-url or {ENV_DB_URL}")
    given["db_url"] = checked_db_url(db_url)
    if not args.create_schema:
        require_existing_file(db_url)
    given["amqp_url"] = checked_amqp_url(args.amqp_url or Settings.from_env().amqp_url)
    return EvaluatorConfig.from_env(
        sender=args.sender,
        sweep_interval_s=args.sweep_interval,
        gauge_interval_s=args.gauge_interval,
        summary_interval_s=args.summary_interval,
        log_level=args.log_level,
        log_format=args.log_format,
        batch_size=args.batch_size,
        store_threads=args.store_threads,
        intake_processes=args.intake_processes,
        relay=not args.no_relay,
        create=args.create_schema,
        freeze_gc=True,  # this process is the service's own
        **given,
    )


def _banner(service: Evaluator, metrics_port: int | None) -> None:
    from condmsg.core import protocol
    from condmsg.runtime.amqp import describe_url

    config = service.config
    sender = config.sender
    writes = [protocol.outcome_queue(sender), protocol.dead_letter_queue(sender)]
    log_banner(
        logging.getLogger(__name__),
        "evaluator",
        {
            "sender": sender,
            "consumes": protocol.ack_queue(sender),
            "writes": ", ".join(writes)
            + " and the destinations' notices and compensations"
            + ("" if config.relay else " (through `condmsg relay`)"),
            "store": describe_db_url(service.engine.url),
            "broker": describe_url(config.amqp_url),
            "metrics_port": "-" if metrics_port is None else metrics_port,
        },
    )


def run(args: argparse.Namespace) -> int:
    from condmsg.runtime.db import make_engine
    from condmsg.runtime.exit_codes import OK, USAGE
    from condmsg.runtime.ops_server import serve_ops
    from evaluator.consume import refuse_unknown_sender
    from evaluator.service import Evaluator

    configure_logging(args.log_level, args.log_format)
    log = logging.getLogger(__name__)
    config = _config(args)
    # Before anything is built or declared: a mistyped --sender is refused in one line
    # (exit 2) and creates no queue.
    engine = make_engine(str(config.db_url))
    try:
        refuse_unknown_sender(config, engine)
    finally:
        engine.dispose()
    service = Evaluator(config)
    _banner(service, args.metrics_port)
    server = serve_ops(
        service.registry, args.metrics_port, live=service.liveness, ready=service.readiness
    )
    stopping = StopSignals().install().event
    service.start()
    said_started = False
    try:
        # The service waits for the database and the broker itself; its thread ends on its
        # own only for a configuration error (logged), which no restart mends.
        while not stopping.wait(0.2):
            if not service.running:
                return USAGE if service.fatal is not None else 1
            if service.prepared and not said_started:
                # Once the store is ready: a store it cannot use says "cannot start" only.
                log.info("evaluator for sender %s started", args.sender)
                said_started = True
        # Graceful: the batch in hand is finished and acked (or handed back), then the
        # relay and the scheduler stop.
        service.stop()
    finally:
        if server is not None:
            server.stop()
    log.info("evaluator for sender %s stopped", args.sender)
    return OK
