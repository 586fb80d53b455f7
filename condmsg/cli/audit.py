"""``condmsg audit``: the Spark audit of a sender store (see docs/audit.md).

pyspark is imported only when the command runs, so ``condmsg --help`` stays fast.
"""

from __future__ import annotations

import argparse
from typing import Any

from condmsg.runtime.exit_codes import add_command
from spark_audit.cli import add_arguments
from spark_audit.cli import run as run_audit


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "audit",
        help="audit acks, latencies and verdicts with Spark",
        description="Audit a condmsg sender store (PostgreSQL via JDBC, or a Parquet export): "
        "re-judge every CM and sphere from its acks, check latencies and verdicts, and write "
        "a report (docs/audit.md).",
    )
    add_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    return run_audit(args)
