"""``condmsg retention``: one retention pass now, outside the evaluator service.

CMs decided longer ago than ``--older-than`` are archived to Parquet under ``--archive``
(the layout ``condmsg export`` writes, one directory per batch) and only then deleted, one
transaction per batch. Safe next to running evaluators (which may run the same job).
Exit codes: :mod:`condmsg.runtime.exit_codes`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from condmsg.cli.options import add_db_url, named_db_url
from condmsg.core.errors import ConfigError
from condmsg.runtime.exit_codes import OK, add_command
from condmsg.runtime.settings import ENV_ARCHIVE_DIR, ENV_RETENTION, Settings
from evaluator.cli import add_policy_arguments


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "retention",
        help="archive decided CMs older than a period to Parquet, then delete them",
        description="One retention pass now: the CMs decided longer ago than --older-than are "
        "archived to Parquet under --archive (the layout condmsg export writes, one directory "
        "per batch) and only then deleted, one transaction per batch. Safe next to running "
        "evaluators.",
    )
    add_policy_arguments(parser, "--older-than")
    add_db_url(parser, "the sender store")
    parser.add_argument(
        "--batch",
        type=int,
        metavar="N",
        # evaluator.retention's DEFAULT_BATCH, not imported here: it loads pyarrow.
        help="CMs per archive (default: 1000)",
    )
    parser.set_defaults(handler=run, schema_store="sender")


def run(args: argparse.Namespace) -> int:
    from condmsg.runtime import migrate
    from condmsg.runtime.db import make_engine
    from evaluator.retention import DEFAULT_BATCH, RetentionPolicy, retain

    settings = Settings.from_env()
    older_than = args.retention or settings.retention
    archive = args.archive or settings.archive_dir
    if older_than is None:
        raise ConfigError(f"give --older-than or set {ENV_RETENTION}")
    if archive is None:
        raise ConfigError(f"give --archive or set {ENV_ARCHIVE_DIR}")
    policy = RetentionPolicy(
        older_than=older_than, archive=archive, batch=args.batch or DEFAULT_BATCH
    )
    engine = make_engine(named_db_url(args, existing=True))
    try:
        # Before the first batch: a store without its schema is a configuration error
        # (one line naming the fix), not a batch that failed.
        migrate.check(engine, "sender")
        archived = retain(
            engine,
            policy,
            on_archived=lambda a: print(f"{a.directory}: {a.total} rows", file=sys.stderr),
        )
    finally:
        engine.dispose()
    cms = sum(a.rows["cms"] for a in archived)
    rows = sum(a.total for a in archived)
    print(
        f"archived and deleted {cms} CMs ({rows} rows) in {len(archived)} archives under {archive}"
    )
    return OK
