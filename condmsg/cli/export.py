"""``condmsg export``: write a sender store (SQLite or PostgreSQL) as the day-partitioned
Parquet layout the Spark audit reads. SQLAlchemy and pyarrow only: no Spark, no JVM."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from condmsg.cli.options import add_db_url, named_db_url
from condmsg.timeutil import parse_cli_instant


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "export", help="export a sender store to Parquet for the audit (no Spark needed)"
    )
    add_db_url(parser, "the sender store")
    parser.add_argument(
        "--out", required=True, metavar="DIR", help="output directory (a path, file://, s3://)"
    )
    parser.add_argument(
        "--since",
        type=parse_cli_instant,
        help="first day exported (UTC; from its midnight). On an existing export: append, "
        "writing the days from this one on again and keeping the earlier ones",
    )
    parser.add_argument("--until", type=parse_cli_instant, help="end of the cut (default: now)")
    parser.set_defaults(handler=run, schema_store="sender")


def run(args: argparse.Namespace) -> int:
    from condmsg.export import export_store

    result = export_store(
        named_db_url(args, existing=True),
        args.out,
        since=args.since,
        until=args.until,
        progress=lambda m: print(m, file=sys.stderr),
    )
    total = sum(result.rows.values())
    print(f"exported {total} rows to {result.directory} (until {result.until.isoformat()})")
    return 0
