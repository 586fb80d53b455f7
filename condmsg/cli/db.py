"""``condmsg db upgrade|current|check``: the schema versions of condmsg's stores.

``--store`` names the store (``sender``, ``receiver`` or ``outbox``; default ``sender``);
``--db-url`` the database (default: ``CONDMSG_DB_URL``; one of the two must be given: this
command never picks a database the user did not name). Exit codes: 0 done or current, 1
the check failed (a database that cannot be used fails it too), 2 a usage or
configuration error (:mod:`condmsg.runtime.exit_codes`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import sqlalchemy as sa

from condmsg.cli.failures import database_problem
from condmsg.cli.options import add_db_url, named_db_url
from condmsg.core.errors import ConfigError
from condmsg.runtime import migrate
from condmsg.runtime.db import describe_db_url, require_existing_file
from condmsg.runtime.exit_codes import FAILED, OK, add_command


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "db",
        help="upgrade, show or check a store's schema",
        description="upgrade: create or upgrade a store's schema to this release's revision "
        "(safe to run again); current: show the revision of every store the database holds; "
        "check: say whether the store is at this release's revision.",
    )
    parser.add_argument("action", choices=("upgrade", "current", "check"))
    parser.add_argument(
        "--store",
        choices=migrate.STORES,
        default="sender",
        help="sender, receiver or outbox (default: %(default)s)",
    )
    add_db_url(parser, "the database")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    url = named_db_url(args)
    if args.action != "upgrade":
        # Only an upgrade creates a store: a mistyped SQLite path must not become an empty
        # file. For check, a store that is not there is a failed check, as a missing schema.
        try:
            require_existing_file(url)
        except ConfigError as exc:
            if args.action != "check":
                raise
            print(f"condmsg db: {exc}", file=sys.stderr)
            return FAILED
    try:
        engine = sa.create_engine(url)
    except (sa.exc.ArgumentError, ImportError) as exc:
        raise ConfigError(f"bad database URL {describe_db_url(url)}: {exc}") from None
    try:
        return _act(args.action, args.store, engine)
    except sa.exc.OperationalError as exc:
        if args.action != "check":
            raise  # a configuration error (2), said by condmsg.cli.failures
        print(f"condmsg db: {database_problem(url, exc, args.store)}", file=sys.stderr)
        return FAILED
    finally:
        engine.dispose()


def _act(action: str, store: str, engine: sa.Engine) -> int:
    if action == "upgrade":
        done = migrate.upgrade(engine, store)
        print(f"{store}: {done.revision} (current)")
        return OK
    if action == "current":
        for name, revision in migrate.revisions(engine).items():
            found = migrate.StoreRevision(name, revision, migrate.head(name))
            print(f"{name}: {revision or '-'} ({found.state.value}; expects {found.head})")
        return OK
    try:
        migrate.check(engine, store)
    except migrate.SchemaError as exc:
        print(f"condmsg db: {exc}", file=sys.stderr)
        return FAILED
    print(f"{store}: current")
    return OK
