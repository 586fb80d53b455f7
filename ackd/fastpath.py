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
with the ``BEGIN`` and ``COMMIT`` it needs anyway. Several statements in one string need
PostgreSQL's simple query protocol, which takes no parameters, so the values are written
into the statements as literals, rendered here by type: strings through libpq's own
``PQescapeLiteral`` (never by hand), instants as ISO text, bytes as hex. If a statement
fails, PostgreSQL skips the rest of the string: ``BEGIN; INSERT`` leaves a failed
transaction that the caller rolls back, and a failed ack insert skips the ``COMMIT``.

What was measured and rejected:

- psycopg's pipeline mode saves the same round trips with bound parameters, but on a
  local socket it costs more than it saves: twice the client CPU of plain statements
  and a longer wall time per message;
- psycopg's client-side binding (``ClientCursor.mogrify``) adapts each value through its
  adapter registry, about 0.65 µs a value against 0.1 µs here (33 values per message);
- SQL ``PREPARE`` + ``EXECUTE`` would spare the server planning both statements (about
  0.1 ms a message), but psycopg answers every ``ROLLBACK`` it runs, a savepoint's
  included, with ``DEALLOCATE ALL`` once it has prepared statements of its own: a
  handler that rolls back a savepoint would make the ack's ``EXECUTE`` fail at commit.

Both statements run on the session's own connection, so they are part of the app's
transaction exactly as portable SQLAlchemy statements would be (SQLite and other drivers
use those).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg import ClientCursor, pq
from psycopg import errors as pg_errors
from psycopg.pq import ExecStatus, TransactionStatus

from ackd.tables import rlog
from outbox.pg import driver_connection, wrapped
from outbox.table import outbox_table

__all__ = ["claim", "commit_ack_statement", "driver_connection", "execute_and_commit"]

_DONE = (ExecStatus.COMMAND_OK, ExecStatus.TUPLES_OK)

#: A statement as the text between its parameters, and the values of its parameters.
Statement = tuple[tuple[str, ...], Sequence[Any]]


def claim(raw: psycopg.Connection[Any], values: Mapping[str, Any]) -> bool:
    """``INSERT ... ON CONFLICT DO NOTHING RETURNING`` into the RLOG, sent with the
    transaction's ``BEGIN`` if none was sent yet; True if this call inserted the row."""
    statement = (_claim_sql(tuple(values)), tuple(values.values()))
    before = ["BEGIN"] if raw.info.transaction_status is TransactionStatus.IDLE else []
    return _exec(raw, before, [statement]).ntuples > 0


def execute_and_commit(raw: psycopg.Connection[Any], statements: Sequence[Statement]) -> None:
    """Run ``statements`` and ``COMMIT`` in one round trip.

    If a statement fails, PostgreSQL skips the rest, the ``COMMIT`` included: the
    transaction is left failed and the caller rolls it back.
    """
    _exec(raw, [], statements, ["COMMIT"])


def commit_ack_statement(
    outbox_row: Mapping[str, Any], rlog_values: Mapping[str, Any]
) -> Statement:
    """The COMMIT ack's outbox row and the RLOG row's ``committed_at``, as one statement.

    ``rlog_values`` holds the RLOG row's key (``cm_id``, ``destination``) and the columns
    to set."""
    sets = tuple(c for c in rlog_values if c not in _RLOG_KEY)
    values = [rlog_values[c] for c in (*sets, *_RLOG_KEY)]
    return _commit_ack_sql(tuple(outbox_row), sets), (*values, *outbox_row.values())


def _exec(
    raw: psycopg.Connection[Any],
    before: list[str],
    statements: Sequence[Statement],
    after: Iterable[str] = (),
) -> pq.abc.PGresult:
    """Send ``before``, the ``statements`` and ``after`` as one query string; the last
    statement's result. Errors are raised as SQLAlchemy would raise them."""
    encoding = raw.info.encoding
    literal = _Literals(raw)
    parts = list(before)
    for pieces, values in statements:
        text = [pieces[0]]
        for value, piece in zip(values, pieces[1:], strict=True):
            text += (literal(value), piece)
        parts.append("".join(text))
    parts += after
    query = "; ".join(parts)
    with raw.lock:
        result = raw.pgconn.exec_(query.encode(encoding))
    if result.status not in _DONE:
        error = pg_errors.error_from_result(result, encoding=encoding)
        raise wrapped(query, {}, error) from error
    return result


class _Literals:
    """Values as SQL literals for one connection (its encoding and string settings)."""

    __slots__ = ("_bytes_prefix", "_encoding", "_escape", "_raw")

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self._raw = raw
        self._encoding = raw.info.encoding
        self._escape: Callable[[bytes], bytes] = pq.Escaping(raw.pgconn).escape_literal
        standard = raw.info.parameter_status("standard_conforming_strings") == "on"
        # In an E'' string the backslash escapes always apply, whatever the setting.
        self._bytes_prefix = "'\\x" if standard else "E'\\\\x"

    def __call__(self, value: Any) -> str:
        if value is None:
            return "NULL"
        if value is True or value is False:
            return "true" if value else "false"
        kind = type(value)
        if kind is str:
            if "\x00" in value:
                raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
            return self._escape(value.encode(self._encoding)).decode(self._encoding)
        if kind is datetime:
            return f"'{value.isoformat()}'"
        if kind is bytes:
            return f"{self._bytes_prefix}{value.hex()}'"
        if kind is int:
            return str(value)
        if kind is dict or kind is list:
            return self(json.dumps(value))
        # Anything else: psycopg's own client-side adaptation.
        return str(ClientCursor(self._raw).mogrify("%s", (value,)))


_RLOG_KEY = ("cm_id", "destination")


def _pieces(*parts: str | int) -> tuple[str, ...]:
    """Statement text from text parts and parameter counts: ``("INSERT ... (", 3, ")")``
    is the text around three comma-separated parameters."""
    pieces = [""]
    for part in parts:
        if isinstance(part, str):
            pieces[-1] += part
        else:
            pieces += [", "] * (part - 1) + [""] if part else []
    return tuple(pieces)


@functools.cache
def _claim_sql(columns: tuple[str, ...]) -> tuple[str, ...]:
    return _pieces(
        f"INSERT INTO {rlog.name} ({', '.join(columns)}) VALUES (",
        len(columns),
        ") ON CONFLICT (cm_id, destination) DO NOTHING RETURNING cm_id",
    )


@functools.cache
def _commit_ack_sql(outbox_columns: tuple[str, ...], sets: tuple[str, ...]) -> tuple[str, ...]:
    parts: list[str | int] = [f"WITH committed AS (UPDATE {rlog.name} SET "]
    for i, column in enumerate(sets):
        parts += [f"{', ' if i else ''}{column} = ", 1]
    parts += [" WHERE cm_id = ", 1, " AND destination = ", 1]
    parts += [
        f") INSERT INTO {outbox_table().name} ({', '.join(outbox_columns)}) VALUES (",
        len(outbox_columns),
        ")",
    ]
    return _pieces(*parts)
