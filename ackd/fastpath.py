"""Round trips saved on PostgreSQL (psycopg 3) in the transactional read path.

A transactional read costs the application one database transaction. Done naively, the
receiver adds four round trips to it: the transaction's ``BEGIN`` (psycopg sends it on its
own before the first statement), the RLOG insert, the COMMIT ack's insert, and ``COMMIT``
on top of the app's own statements. Two of them ride along here:

- ``BEGIN`` and the RLOG insert travel as one query string (``BEGIN; INSERT ...
  RETURNING``) when the transaction has not begun yet;
- the COMMIT ack (one statement that also stamps the RLOG row's ``committed_at``) and
  ``COMMIT`` travel as one (``WITH ... INSERT ...; COMMIT``).

So the receiver's two statements add no round trip to the app's transaction: they travel
with the ``BEGIN`` and ``COMMIT`` it needs anyway. Several statements in one
string need PostgreSQL's simple query protocol, which takes no parameters, so the values
are bound on the client with psycopg's own quoting (``ClientCursor.mogrify``). If a
statement fails, PostgreSQL skips the rest of the string: ``BEGIN; INSERT`` leaves a
failed transaction that the caller rolls back, and a failed ack insert skips the ``COMMIT``.

psycopg's pipeline mode would save the same round trips with bound parameters, but on a
local socket it costs more than it saves: measured on this path, twice the client CPU of
plain statements and a longer wall time per message. Both statements run on the session's
own connection, so they are part of the app's transaction exactly as portable SQLAlchemy
statements would be (SQLite and other drivers use those).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import ClientCursor
from psycopg import errors as pg_errors
from psycopg.pq import ExecStatus, TransactionStatus
from psycopg.types.json import Json

from ackd.tables import rlog
from outbox.pg import driver_connection, execute, wrapped
from outbox.table import outbox_table

__all__ = ["claim", "commit_ack_statement", "driver_connection", "execute_and_commit"]

_DONE = (ExecStatus.COMMAND_OK, ExecStatus.TUPLES_OK)


def claim(raw: psycopg.Connection[Any], values: Mapping[str, Any]) -> bool:
    """``INSERT ... ON CONFLICT DO NOTHING RETURNING`` into the RLOG, sent with the
    transaction's ``BEGIN`` if none was sent yet; True if this call inserted the row."""
    sql = _claim_sql(tuple(values))
    if raw.info.transaction_status is not TransactionStatus.IDLE:
        return bool(execute(raw, sql, values))
    return _exec(raw, ["BEGIN", sql], values).ntuples > 0


def execute_and_commit(
    raw: psycopg.Connection[Any], statements: Sequence[tuple[str, Mapping[str, Any]]]
) -> None:
    """Run ``statements`` and ``COMMIT`` in one round trip.

    If a statement fails, PostgreSQL skips the rest, the ``COMMIT`` included: the
    transaction is left failed and the caller rolls it back.
    """
    texts = [_bind(raw, sql, values) for sql, values in statements]
    _exec(raw, [*texts, "COMMIT"], {})


def commit_ack_statement(
    outbox_row: Mapping[str, Any], rlog_values: Mapping[str, Any]
) -> tuple[str, dict[str, Any]]:
    """The COMMIT ack's outbox row and the RLOG row's ``committed_at``, as one statement."""
    values = {f"o_{k}": _adapt(v) for k, v in outbox_row.items()}
    values |= {f"r_{k}": v for k, v in rlog_values.items()}
    return _commit_ack_sql(tuple(outbox_row), tuple(rlog_values)), values


def _bind(raw: psycopg.Connection[Any], sql: str, values: Mapping[str, Any]) -> str:
    """``sql`` with ``values`` merged in as literals (psycopg's client-side binding)."""
    if not values:
        return sql
    try:
        return ClientCursor(raw).mogrify(sql, values)
    except psycopg.Error as exc:
        raise wrapped(sql, values, exc) from exc


def _exec(
    raw: psycopg.Connection[Any], statements: list[str], values: Mapping[str, Any]
) -> psycopg.pq.abc.PGresult:
    """Send ``statements`` (the last one bound to ``values``) as one query string; the
    last statement's result. Errors are raised as SQLAlchemy would raise them."""
    *head, last = statements
    text = "; ".join([*head, _bind(raw, last, values)])
    encoding = raw.info.encoding
    with raw.lock:
        result = raw.pgconn.exec_(text.encode(encoding))
    if result.status not in _DONE:
        error = pg_errors.error_from_result(result, encoding=encoding)
        raise wrapped(text, {}, error) from error
    return result


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
