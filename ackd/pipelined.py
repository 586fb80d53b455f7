"""Round trips saved on PostgreSQL (psycopg 3) in the transactional read path.

A transactional read costs the application one database transaction. Done naively, the
receiver adds four round trips to it (BEGIN, the RLOG insert, the ack insert, COMMIT on top
of the app's own statements). With psycopg's pipeline mode two of them ride along:

- the RLOG insert travels with the transaction's BEGIN (when it is the first statement);
- the COMMIT ack travels with the COMMIT.

So a transactional read costs the same number of round trips as the app's bare
transaction. Both statements are plain SQL on the session's own connection, so they are
part of the app's transaction exactly as before. Elsewhere (SQLite, another driver) the
callers use the portable SQLAlchemy statements instead.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg.types.json import Json

from ackd.tables import rlog
from outbox.pg import driver_connection, wrapped
from outbox.table import outbox_table

__all__ = ["claim", "commit_ack_statement", "driver_connection", "execute_and_commit"]


def claim(raw: psycopg.Connection[Any], values: Mapping[str, Any]) -> bool:
    """``INSERT ... ON CONFLICT DO NOTHING RETURNING`` into the RLOG, pipelined with the
    transaction's BEGIN if none was sent yet; True if this call inserted the row."""
    sql = _claim_sql(tuple(values))
    try:
        with raw.pipeline(), raw.cursor() as cursor:
            cursor.execute(sql, values)
            return cursor.fetchone() is not None
    except psycopg.Error as exc:
        raise wrapped(sql, values, exc) from exc


def execute_and_commit(
    raw: psycopg.Connection[Any], statements: Sequence[tuple[str, Mapping[str, Any]]]
) -> None:
    """Run ``statements`` and COMMIT in one pipeline (one round trip).

    If a statement fails, PostgreSQL skips the rest of the pipeline, the COMMIT included:
    the transaction is left failed and the caller rolls it back.
    """
    sql = ""
    try:
        with raw.pipeline(), raw.cursor() as cursor:
            for sql, values in statements:
                cursor.execute(sql, values)
            raw.commit()
    except psycopg.Error as exc:
        raise wrapped(sql, {}, exc) from exc


def commit_ack_statement(
    outbox_row: Mapping[str, Any], rlog_values: Mapping[str, Any]
) -> tuple[str, dict[str, Any]]:
    """The COMMIT ack's outbox row and the RLOG row's ``committed_at``, as one statement."""
    values = {f"o_{k}": _adapt(v) for k, v in outbox_row.items()}
    values |= {f"r_{k}": v for k, v in rlog_values.items()}
    return _commit_ack_sql(tuple(outbox_row), tuple(rlog_values)), values


def _adapt(value: Any) -> Any:
    return Json(value) if isinstance(value, dict) else value


@functools.cache
def _claim_sql(columns: tuple[str, ...]) -> str:
    return (
        f"INSERT INTO {rlog.name} ({', '.join(columns)}) "
        f"VALUES ({', '.join(f'%({c})s' for c in columns)}) "
        "ON CONFLICT (cm_id, destination) DO NOTHING RETURNING cm_id"
    )


@functools.cache
def _commit_ack_sql(outbox_columns: tuple[str, ...], rlog_columns: tuple[str, ...]) -> str:
    key = ("cm_id", "destination")
    sets = ", ".join(f"{c} = %(r_{c})s" for c in rlog_columns if c not in key)
    where = " AND ".join(f"{c} = %(r_{c})s" for c in key)
    table = outbox_table().name
    return (
        f"WITH committed AS (UPDATE {rlog.name} SET {sets} WHERE {where}) "
        f"INSERT INTO {table} ({', '.join(outbox_columns)}) "
        f"VALUES ({', '.join(f'%(o_{c})s' for c in outbox_columns)})"
    )
