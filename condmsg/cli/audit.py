"""``condmsg audit``: the Spark audit of a sender store (see docs/audit.md).

pyspark is imported only when the command runs, so ``condmsg --help`` stays fast.
"""

from __future__ import annotations

import argparse
from typing import Any

from spark_audit.cli import add_arguments
from spark_audit.cli import run as run_audit


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "audit",
        help="audit acks, latencies and verdicts with Spark",
        description="Audit a condmsg sender store (PostgreSQL via JDBC, or a Parquet export). "
        "Exit code 0: passed or warnings; 1: an error-level check failed; 2: input or "
        "runtime error.",
    )
    add_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    return run_audit(args)
