"""Command line of the audit, shared by ``condmsg audit`` and ``python -m spark_audit``
(the ``spark-submit`` entry point).

Exit codes: 0 the audit passed (possibly with warnings), 1 an error-level check failed,
2 bad input or a runtime error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from condmsg.core.timeutil import parse_cli_instant, utcnow

if TYPE_CHECKING:
    from spark_audit.readers import AuditInput, Window

EXIT_OK, EXIT_FAILED, EXIT_ERROR = 0, 1, 2


def _threshold(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return name.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected CHECK=NUMBER, got {text!r}") from None


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


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
    source.add_argument(
        "--parquet",
        metavar="URI",
        help="a directory written by condmsg export (a path, file://, hdfs://, s3a://)",
    )
    parser.add_argument(
        "--out",
        required=True,
        metavar="URI",
        help="where to write the tables, summary.json and report.html (a path or a URI)",
    )
    parser.add_argument(
        "--master", metavar="URL", help="Spark master URL (default: the environment's)"
    )
    parser.add_argument(
        "--conf",
        type=_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting (repeatable); the user's settings win over the audit's",
    )
    parser.add_argument("--since", type=parse_cli_instant, help="first sent_at included (UTC)")
    parser.add_argument(
        "--until",
        type=parse_cli_instant,
        help="end of the cut (exclusive for sent_at; default: the export's, else now)",
    )
    parser.add_argument("--jdbc-jar", help="PostgreSQL JDBC driver jar")
    parser.add_argument(
        "--jdbc-partitions",
        type=_positive,
        metavar="N",
        help="parallel JDBC reads per table (default: one per core Spark runs tasks on)",
    )
    parser.add_argument(
        "--jdbc-fetch-size",
        "--fetchsize",
        dest="fetchsize",
        type=_positive,
        default=10_000,
        metavar="ROWS",
        help="rows per round trip to PostgreSQL (default: %(default)s)",
    )
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
        metavar="MS",
        help="a CM pending this long after its evaluation deadline is stale (default: %(default)s)",
    )
    parser.add_argument(
        "--shuffle-partitions",
        type=_positive,
        metavar="N",
        help="at least N partitions for the audit's frames and shuffles (default: one per "
        "core in local mode, else spark.sql.shuffle.partitions; more for many CMs)",
    )
    parser.add_argument("--driver-memory", help="spark.driver.memory (local mode), e.g. 4g")
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress lines, no Spark console progress bar, Spark's log at ERROR",
    )
    _what_if_arguments(parser)


def _what_if_arguments(parser: argparse.ArgumentParser) -> None:
    """The what-if replay's options: they replace the audit (docs/audit.md)."""
    parser.add_argument(
        "--what-if",
        nargs="+",
        metavar="CHANGE",
        help="instead of the audit, re-judge every decided CM under changed conditions, e.g. "
        "pickup=2h process@qr3*=0.5 min_process=2 sender=NAME (docs/audit.md, What-if replay)",
    )
    parser.add_argument(
        "--sweep",
        metavar="FIELD=V1,V2,...",
        help="with or without --what-if: the failure rate for each value of one field, e.g. "
        "pickup=15m,1h,4h,48h (one pass; a chart in OUT/what_if.html)",
    )


def run(args: argparse.Namespace) -> int:
    """Run the audit for parsed ``args``; returns the exit code."""
    say = (lambda _m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    try:
        return _run(args, say)
    except Exception as exc:  # the edge: any failure is reported as exit code 2
        print(f"condmsg audit: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _run(args: argparse.Namespace, say: Any) -> int:
    # Imported here, not at the top, so that the parser is built without the audit extra
    # too (condmsg audit --help): spark_audit.storage needs pyarrow.
    from spark_audit.checks import DEFAULT_CHECKS, with_thresholds
    from spark_audit.job import AuditOptions, run_audit
    from spark_audit.storage import child

    if args.what_if or args.sweep:
        return _run_what_if(args, say)
    checks = with_thresholds(DEFAULT_CHECKS, dict(args.threshold))
    if args.parquet:
        _refuse_a_missing_local_export(args.parquet)
    spark = _session(args)
    with _input(spark, args, say) as (data, source, window):
        options = AuditOptions(
            out=args.out,
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
    print(f"audit {result.status}: {child(args.out, 'report.html')}")
    return EXIT_FAILED if result.status == "fail" else EXIT_OK


def _run_what_if(args: argparse.Namespace, say: Any) -> int:
    import json

    from spark_audit.changes import parse_changes, sweep_changes
    from spark_audit.storage import child, write_text
    from spark_audit.what_if import sweep, what_if

    changes = parse_changes(args.what_if or ())  # a bad change fails before Spark starts
    grid: tuple[str, list[str]] | None = None
    if args.sweep:
        field, sep, values = args.sweep.partition("=")
        grid = (field.strip(), [v.strip() for v in values.split(",") if v.strip()])
        if not sep or not grid[1]:
            raise ValueError(f"--sweep: expected FIELD=V1,V2,..., got {args.sweep!r}")
        sweep_changes(*grid)
    if args.parquet:
        _refuse_a_missing_local_export(args.parquet)
    spark = _session(args)
    report: dict[str, Any] = {"schema": "condmsg.audit.what_if", "version": 1}
    charts = []
    with _input(spark, args, say) as (data, _source, window):
        if args.what_if:
            result = what_if(
                spark,
                data,
                changes,
                since=window.since,
                until=window.until,
                partitions=args.shuffle_partitions,
            )
            report.update(changes=result.changes, totals=result.totals, flips=result.flips)
            t = result.totals
            print(
                f"what-if {result.changes}: {t['judged']} CMs judged, violated "
                f"{t['violated_before']} -> {t['violated_after']}, "
                f"{t['flips_to_violated']} satisfied -> violated, "
                f"{t['flips_to_satisfied']} violated -> satisfied"
            )
        if grid is not None:
            swept = sweep(
                spark,
                data,
                grid[0],
                grid[1],
                changes=args.what_if or (),
                since=window.since,
                until=window.until,
                partitions=args.shuffle_partitions,
            )
            report["sweep"] = {
                "parameter": swept.parameter,
                "recorded": swept.baseline,
                "points": swept.points,
            }
            for point in swept.points:
                rate = point["failure_rate"]
                shown = "-" if rate is None else f"{100 * rate:.2f} %"
                print(f"sweep {swept.parameter}={point['value']}: {shown} violated")
            charts.append(swept.chart())
    write_text(spark, child(args.out, "what_if.json"), json.dumps(report, default=str, indent=1))
    page = "<!doctype html><meta charset=utf-8><title>condmsg what-if</title>" + "".join(charts)
    write_text(spark, child(args.out, "what_if.html"), page)
    print(f"what-if: {child(args.out, 'what_if.json')}")
    return EXIT_OK


def _session(args: argparse.Namespace) -> Any:
    from spark_audit.session import SessionOptions, build_session

    return build_session(
        SessionOptions(
            master=args.master,
            jdbc_jar=args.jdbc_jar,
            driver_memory=args.driver_memory,
            quiet=args.quiet,
            extra=dict(args.conf),
        )
    )


@contextmanager
def _input(
    spark: Any, args: argparse.Namespace, say: Any
) -> Iterator[tuple[AuditInput, str, Window]]:
    """The source's frames for the window, what the summary calls the source, and the
    window (``until`` defaults to the export's, else now)."""
    from spark_audit import storage
    from spark_audit.jdbc import jdbc_input, jdbc_source
    from spark_audit.readers import Window, export_until, read_parquet

    until = args.until
    if until is None and args.parquet:
        until = export_until(spark, args.parquet)
    window = Window(until=until or utcnow(), since=args.since)
    say(f"[audit] window [{window.since or 'start'}, {window.until})")
    if args.parquet:
        # The audit cuts the frames at the window itself; the reader reads its days only.
        data = read_parquet(spark, args.parquet, window)
        yield data, storage.qualified(spark, args.parquet), window
        return
    jdbc = jdbc_source(args.source, fetchsize=args.fetchsize, partitions=args.jdbc_partitions)
    with jdbc_input(spark, jdbc, window) as data:
        yield data, jdbc.describe(), window


def _refuse_a_missing_local_export(location: str) -> None:
    """A local export without a ``cms`` table is refused before Spark starts."""
    parts = urlsplit(location)
    if parts.scheme in ("", "file") and not Path(parts.path or location, "cms").exists():
        raise FileNotFoundError(f"{location}: not a condmsg export (no cms/ directory)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="spark_audit", description="Audit a condmsg sender store with Spark."
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
