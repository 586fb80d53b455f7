"""PostgreSQL fast paths through the psycopg 3 connection under a SQLAlchemy session.

Batches go to PostgreSQL as one statement with one array parameter per column
(``INSERT ... SELECT * FROM unnest(...)``): parsed once, one round trip, whatever the batch
size. The arrays are sent in psycopg's binary format (``%(name)b``): dumping them as text
would escape every element (every ``bytea`` body byte by byte), which costs more than the
database's whole work on the batch. SQLAlchemy cannot ask for binary parameters, so these
statements run on the driver connection, inside the session's transaction all the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
import sqlalchemy as sa


def execute(
    raw: psycopg.Connection[Any], sql: str, params: Mapping[str, Any]
) -> list[tuple[Any, ...]]:
    """Run ``sql`` on ``raw``; the rows it returns (none for a plain INSERT)."""
    try:
        with raw.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall() if cursor.description is not None else []
    except psycopg.Error as exc:
        raise wrapped(sql, params, exc) from exc


def unnest_insert(
    table: str,
    arrays: Mapping[str, str],
    *,
    constants: Mapping[str, str] | None = None,
    suffix: str = "",
) -> str:
    """``INSERT INTO table (...) SELECT <constants>, u.* FROM unnest(<arrays>) AS u``.

    ``arrays`` maps each column to its PostgreSQL element type; the parameters are named
    after the columns and bound in binary. ``constants`` maps columns to SQL expressions
    (or ``%(name)s`` parameters) that are the same for every row. ``suffix`` follows the
    statement (``ON CONFLICT ...``, ``RETURNING ...``).
    """
    constants = dict(constants or {})
    columns = [*constants, *arrays]
    casts = ", ".join(f"CAST(%({c})b AS {type_}[])" for c, type_ in arrays.items())
    select = ", ".join([*constants.values(), "u.*"])
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) "
        f"SELECT {select} FROM unnest({casts}) AS u {suffix}".rstrip()
    )


def wrapped(sql: str, params: Mapping[str, Any], exc: psycopg.Error) -> sa.exc.StatementError:
    """The error as SQLAlchemy would have raised it (callers inspect ``.orig.sqlstate``)."""
    return sa.exc.DBAPIError.instance(sql, dict(params), exc, psycopg.Error)
