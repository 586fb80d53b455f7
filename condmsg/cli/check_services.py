"""``condmsg check-services``: verify that RabbitMQ and PostgreSQL answer.

Used by ``make test`` and ``make demo`` before anything else runs, so a stopped service
produces one clear message naming the command that starts it instead of a wall of
connection errors.
"""

from __future__ import annotations

import argparse
import socket
import sys
from typing import Any
from urllib.parse import urlsplit

from condmsg.settings import Settings

_HINTS = {
    "RabbitMQ": "rabbitmq-server -detached",
    "PostgreSQL": "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start",
}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "check-services", help="check that RabbitMQ and PostgreSQL answer"
    )
    parser.add_argument("--amqp-url", help="default: CONDMSG_AMQP_URL or the local broker")
    parser.add_argument(
        "--pg-url", help="default: CONDMSG_TEST_PG_URL, CONDMSG_DB_URL or the local server"
    )
    parser.set_defaults(handler=run)


def _probe(service: str, url: str, default_port: int) -> str | None:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or default_port
    try:
        with socket.create_connection((host, port), timeout=3):
            return None
    except OSError as exc:
        return (
            f"cannot reach {service} at {host}:{port} ({exc.strerror or exc}); "
            f"is it running? start it with: {_HINTS[service]}"
        )


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    amqp = args.amqp_url or settings.amqp_url
    pg = args.pg_url or settings.test_pg_url
    problems = [
        p for p in (_probe("RabbitMQ", amqp, 5672), _probe("PostgreSQL", pg, 5432)) if p is not None
    ]
    for problem in problems:
        print(f"condmsg check-services: {problem}", file=sys.stderr)
    if not problems:
        print("RabbitMQ and PostgreSQL answer.")
    return 1 if problems else 0
