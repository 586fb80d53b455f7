"""The rows a send writes: the port a :class:`~condmsg.sending.sender.Sender` writes them
through, and its adapters.

A send writes three kinds of rows in one transaction: the CM, one copy per destination and
one compensation per destination. :class:`SqlAlchemySendStore` inserts them with SQLAlchemy
Core on any database, one executemany per table; :class:`PsycopgSendStore` sends them to
PostgreSQL as one statement, each table's rows bound as one binary array per column (see
:mod:`outbox.pg`), or as plain values when a table gets one row, so a batch costs one
statement however many CMs it holds. The sender picks one adapter when it is built;
``tests/contract/test_send_store.py`` holds both to the same rows.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from condmsg import tables
from outbox import backends, pg


@dataclass(frozen=True, slots=True, kw_only=True)
class SendRows:
    """The rows of a batch of sends, as column values keyed by column name: ``cms`` for
    :data:`~condmsg.tables.cms`, ``copies`` and ``compensations`` likewise. Within
    one list every row has the same keys."""

    cms: list[dict[str, Any]] = field(default_factory=list)
    copies: list[dict[str, Any]] = field(default_factory=list)
    compensations: list[dict[str, Any]] = field(default_factory=list)

    def by_table(self) -> tuple[tuple[sa.Table, list[dict[str, Any]]], ...]:
        """Each table with its rows, CMs first (the others refer to them)."""
        return (
            (tables.cms, self.cms),
            (tables.copies, self.copies),
            (tables.compensations, self.compensations),
        )


class SendStore(Protocol):
    """Writes and reads a sender's CM rows in the caller's transaction; never commits."""

    def add(self, session: Session, rows: SendRows) -> None:
        """Insert ``rows``. A CM id or copy message id already stored raises
        :class:`sqlalchemy.exc.IntegrityError` (the caller's transaction is then failed)."""

    def cm(self, bind: Session | Connection, cm_id: str) -> sa.Row[Any] | None:
        """The CM row of ``cm_id`` (every column of the table), or None if there is none."""


class SqlAlchemySendStore:
    """:class:`SendStore` on SQLAlchemy Core: an executemany per table, on any database."""

    def add(self, session: Session, rows: SendRows) -> None:
        for table, values in rows.by_table():
            if values:
                session.execute(sa.insert(table), values)

    def cm(self, bind: Session | Connection, cm_id: str) -> sa.Row[Any] | None:
        return bind.execute(sa.select(tables.cms).where(tables.cms.c.cm_id == cm_id)).first()


class PsycopgSendStore(SqlAlchemySendStore):
    """:class:`SendStore` for PostgreSQL through psycopg 3: one statement for all three
    tables, its rows bound as one array per column (as a plain row when a table gets one)."""

    def add(self, session: Session, rows: SendRows) -> None:
        parts = tuple((table, values) for table, values in rows.by_table() if values)
        if not parts:
            return
        shape = tuple((table, tuple(values[0]), len(values) == 1) for table, values in parts)
        params: dict[str, Any] = {}
        for (table, columns, one), (_, values) in zip(shape, parts, strict=True):
            for column, array in _arrays(table, columns, values).items():
                params[_param(table, column)] = array[0] if one else array
        pg.execute(backends.psycopg_connection(session), _insert(shape), params)


def _arrays(
    table: sa.Table, columns: tuple[str, ...], rows: Sequence[Mapping[str, Any]]
) -> dict[str, list[Any]]:
    """One array per column; JSON columns as JSON text (the statement casts it)."""
    arrays = {c: [row[c] for row in rows] for c in columns}
    for column in columns:
        if isinstance(table.c[column].type, sa.JSON):
            arrays[column] = [None if v is None else json.dumps(v) for v in arrays[column]]
    return arrays


@functools.lru_cache(maxsize=64)
def _insert(shape: tuple[tuple[sa.Table, tuple[str, ...], bool], ...]) -> str:
    """The one statement that inserts the rows of every table of ``shape`` (each table
    with the columns given, and whether it gets one row): all but the last as data-modifying
    ``WITH`` queries, which PostgreSQL runs to completion whether or not anything reads
    them. The foreign keys of the copies and compensations are checked at the end of the
    statement, when the CMs are in."""
    inserts = [_table_insert(table, columns, one) for table, columns, one in shape]
    if len(inserts) == 1:
        return inserts[0]
    with_ = ", ".join(f"w{i} AS ({sql})" for i, sql in enumerate(inserts[:-1]))
    return f"WITH {with_} {inserts[-1]}"


def _table_insert(table: sa.Table, columns: tuple[str, ...], one: bool) -> str:
    """One row of values (``one``), else a row per element of the column arrays (bound
    in binary: see :mod:`outbox.pg`)."""
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    types = {c: str(table.c[c].type.compile(dialect=dialect)) for c in columns}
    head = f"INSERT INTO {table.name} ({', '.join(columns)})"
    if one:
        values = ", ".join(f"CAST(%({_param(table, c)})s AS {t})" for c, t in types.items())
        return f"{head} VALUES ({values})"
    arrays = ", ".join(f"CAST(%({_param(table, c)})b AS {t}[])" for c, t in types.items())
    return f"{head} SELECT * FROM unnest({arrays}) AS u"


def _param(table: sa.Table, column: str) -> str:
    """A column's parameter, named after its table too (the tables share column names)."""
    return f"{table.name}.{column}"
