"""``condmsg export``: write a sender store (SQLite or PostgreSQL) as the day-partitioned
Parquet layout the Spark audit reads. SQLAlchemy and pyarrow only: no Spark, no JVM.

An export without ``--since`` replaces what its directory holds, so a directory that is
not empty is refused unless ``--overwrite`` says to replace it (or ``--since`` appends to
an earlier export there). Exit codes: :mod:`condmsg.runtime.exit_codes`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from condmsg.cli.options import add_db_url, named_db_url
from condmsg.core.errors import ConfigError
from condmsg.core.timeutil import parse_cli_instant
from condmsg.runtime.exit_codes import OK, add_command

#: What pyarrow's S3 filesystem reads, for a message about an ``s3://`` output it cannot use.
S3_SETTINGS = (
    "pyarrow reads S3 credentials from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or "
    "~/.aws), the region from AWS_DEFAULT_REGION or ?region=, and an S3-compatible store "
    "from ?endpoint_override=host:port"
)


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "export",
        help="export a sender store to Parquet for the audit (no Spark needed)",
        description="Write a sender store as the day-partitioned Parquet layout condmsg audit "
        "reads (--parquet): a local directory, file:// or s3://. Without --since it writes "
        "every day, replacing what the directory held (--overwrite); with --since it appends "
        "to an earlier export there.",
    )
    add_db_url(parser, "the sender store")
    parser.add_argument(
        "--out", required=True, metavar="DIR", help="output directory (a path, file://, s3://)"
    )
    parser.add_argument(
        "--since",
        type=parse_cli_instant,
        metavar="INSTANT",
        help="first day exported (UTC; from its midnight). On an existing export: append, "
        "writing the days from this one on again and keeping the earlier ones "
        "(default: every day, replacing the directory's content)",
    )
    parser.add_argument(
        "--until", type=parse_cli_instant, metavar="INSTANT", help="end of the cut (default: now)"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace what a directory that is not empty holds (default: refuse it)",
    )
    parser.set_defaults(handler=run, schema_store="sender")


def run(args: argparse.Namespace) -> int:
    from condmsg.archive.export import export_store
    from condmsg.runtime import migrate
    from condmsg.runtime.db import make_engine

    db_url = named_db_url(args, existing=True)
    engine = make_engine(db_url)
    try:
        migrate.check(engine, "sender")  # one line naming the fix, not a raw SQL error
    finally:
        engine.dispose()
    _check_out(str(args.out), replace=args.overwrite or args.since is not None)
    try:
        result = export_store(
            db_url,
            args.out,
            since=args.since,
            until=args.until,
            progress=lambda m: print(m, file=sys.stderr),
        )
    except OSError as exc:
        raise ConfigError(_unwritable(str(args.out), exc)) from None
    total = sum(result.rows.values())
    print(f"exported {total} rows to {result.directory} (until {result.until.isoformat()})")
    return OK


def _check_out(out: str, *, replace: bool) -> None:
    """:class:`ConfigError` for an output that is a file, under a file, or a directory
    with content that ``replace`` does not allow to be replaced."""
    from pyarrow import fs as pafs

    from condmsg.archive.files import ExportTarget

    if "://" not in out:
        existing = Path(out).absolute()
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            which = "" if existing == Path(out).absolute() else f"{existing} is "
            raise ConfigError(f"--out {out}: {which}not a directory")
    try:
        target = ExportTarget.at(out)
        info = target.fs.get_file_info(target.root)
        if info.type == pafs.FileType.File:
            raise ConfigError(f"--out {out}: not a directory")
        if info.type != pafs.FileType.Directory or replace:
            return
        if target.fs.get_file_info(pafs.FileSelector(target.root)):
            raise ConfigError(
                f"--out {out} is not empty: an export replaces what it holds; add --overwrite "
                "to replace it, or --since to append to an earlier export there"
            )
    except OSError as exc:
        raise ConfigError(_unwritable(out, exc)) from None


def _unwritable(out: str, exc: OSError) -> str:
    """One line for an output pyarrow cannot use (its messages span lines and errnos)."""
    reason = " ".join(str(exc).split())
    hint = S3_SETTINGS if out.startswith("s3://") else "check the path and its permissions"
    return f"cannot write the export to {out}: {reason}; {hint}"
