"""Command line of the audit, shared by ``condmsg audit`` and ``python -m spark_audit``
(the ``spark-submit`` entry point).

Exit codes: 0 the audit passed (possibly with warnings), 1 an error-level check failed,
2 bad input or a runtime error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from condmsg.timeutil import parse_cli_instant

EXIT_OK, EXIT_FAILED, EXIT_ERROR = 0, 1, 2


def _threshold(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return name.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected CHECK=NUMBER, got {text!r}") from None


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--source",
        metavar="URL",
        help="PostgreSQL store: postgresql://... or jdbc:postgresql://...",
    )
    source.add_argument("--parquet", metavar="DIR", help="a directory written by condmsg export")
    parser.add_argument("--out", required=True, metavar="DIR", help="where to write the results")
    parser.add_argument("--master", help="Spark master URL (default: the environment's)")
    parser.add_argument("--since", type=parse_cli_instant, help="first sent_at included (UTC)")
    parser.add_argument(
        "--until",
        type=parse_cli_instant,
        help="end of the cut (exclusive for sent_at; default: the export's, else now)",
    )
    parser.add_argument("--jdbc-jar", help="PostgreSQL JDBC driver jar")
    parser.add_argument("--jdbc-partitions", type=int, default=4, help="parallel JDBC reads")
    parser.add_argument("--fetchsize", type=int, default=10_000, help="JDBC fetch size (rows)")
    parser.add_argument(
        "--threshold",
        type=_threshold,
        action="append",
        default=[],
        metavar="CHECK=VALUE",
        help="override a check's threshold (repeatable)",
    )
    parser.add_argument(
        "--stale-grace-ms",
        type=int,
        default=60_000,
        help="a CM pending this long after its evaluation deadline is stale",
    )
    parser.add_argument(
        "--shuffle-partitions",
        type=_positive,
        metavar="N",
        help="at least N partitions for the audit's frames and shuffles (default: one per "
        "core in local mode, else spark.sql.shuffle.partitions; more for many CMs)",
    )
    parser.add_argument("--driver-memory", help="spark.driver.memory (local mode), e.g. 4g")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def run(args: argparse.Namespace) -> int:
    """Run the audit for parsed ``args``; returns the exit code."""
    say = (lambda _m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    try:
        return _run(args, say)
    except Exception as exc:  # the edge: any failure is reported as exit code 2
        print(f"condmsg audit: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _run(args: argparse.Namespace, say: Any) -> int:
    from condmsg.archive_layout import read_manifest
    from condmsg.timeutil import utcnow
    from spark_audit.checks import DEFAULT_CHECKS, with_thresholds
    from spark_audit.jdbc import jdbc_source, read_jdbc
    from spark_audit.job import AuditOptions, run_audit
    from spark_audit.readers import Window, read_parquet
    from spark_audit.session import SessionOptions, build_session

    checks = with_thresholds(DEFAULT_CHECKS, dict(args.threshold))
    until = args.until
    if until is None and args.parquet:
        manifest = read_manifest(args.parquet)
        if manifest and manifest.get("until"):
            until = parse_cli_instant(manifest["until"])
    window = Window(until=until or utcnow(), since=args.since)
    if args.parquet and not Path(args.parquet, "cms").exists():
        raise FileNotFoundError(f"{args.parquet}: not a condmsg export (no cms/ directory)")
    say(f"[audit] window [{window.since or 'start'}, {window.until})")
    spark = build_session(
        SessionOptions(
            master=args.master,
            jdbc_jar=args.jdbc_jar,
            driver_memory=args.driver_memory,
        )
    )
    if args.parquet:
        data = read_parquet(spark, args.parquet)  # the audit cuts it at the window
        source = str(Path(args.parquet).resolve())
    else:
        jdbc = jdbc_source(args.source, fetchsize=args.fetchsize, partitions=args.jdbc_partitions)
        data = read_jdbc(spark, jdbc, window)
        source = jdbc.describe()
    options = AuditOptions(
        out=Path(args.out),
        window=window,
        source=source,
        checks=checks,
        stale_grace=timedelta(milliseconds=args.stale_grace_ms),
        partitions=args.shuffle_partitions,
    )
    result = run_audit(spark, data, options, progress=say)
    failed = [c for c in result.summary["checks"] if not c["passed"]]
    for check in failed:
        print(
            f"{check['severity'].upper()} {check['name']}: {check['observed']:g} > "
            f"{check['threshold']:g} ({check['description']})",
            file=sys.stderr,
        )
    print(f"audit {result.status}: {options.out / 'report.html'}")
    return EXIT_FAILED if result.status == "fail" else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="spark_audit", description="Audit a condmsg sender store with Spark."
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
