"""Options every command reads the same way."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from sqlalchemy.engine import make_url

from condmsg.errors import ConfigError
from condmsg.settings import ENV_DB_URL


def named_db_url(args: argparse.Namespace, *, existing: bool = False) -> str:
    """The database the user named: ``--db-url``, else ``CONDMSG_DB_URL``. A command never
    picks one by itself (a default SQLite file would appear in whatever directory it ran
    in). With ``existing``, a SQLite file must already be there: a command that only reads
    a store must not create an empty one."""
    url = getattr(args, "db_url", None) or os.environ.get(ENV_DB_URL)
    if not url:
        raise ConfigError(f"name the database: --db-url or {ENV_DB_URL}")
    if existing:
        parsed = make_url(str(url))
        path = parsed.database
        sqlite_file = parsed.get_backend_name() == "sqlite" and path and path != ":memory:"
        if sqlite_file and not Path(str(path)).exists():
            raise ConfigError(f"no store at {path} (a SQLite file that does not exist)")
    return str(url)
