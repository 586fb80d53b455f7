"""The rows a send writes: the port a :class:`~condmsg.sending.sender.Sender` writes them
through, and its adapters.

A send writes four kinds of rows in one transaction: the CM, one copy per destination, one
compensation per destination and the outbox rows that carry the copies to the broker.
:class:`SqlAlchemySendStore` inserts them with SQLAlchemy Core on any database, one
executemany per table, then the outbox rows through :func:`outbox.enqueueing.enqueue_fanouts`;
:class:`PsycopgSendStore` sends all four to PostgreSQL as one statement, each table's rows
bound as one binary array per column (see :mod:`condmsg.infra.fastpaths.pg`), or as plain
values when a table gets one row, and the outbox rows as the INSERT
:func:`outbox.enqueueing.fanouts_statement` builds, so a batch costs one round trip however
many CMs it holds. The sender picks one adapter when it is built;
``tests/contract/test_send_store.py`` holds both to the same rows.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from condmsg import tables
from condmsg.infra import backends
from condmsg.infra.fastpaths import pg
from outbox.enqueueing import enqueue_fanouts, fanouts_statement
from outbox.message import Fanout


@dataclass(frozen=True, slots=True, kw_only=True)
class SendRows:
    """The rows of a batch of sends, as column values keyed by column name: ``cms`` for
    :data:`~condmsg.tables.cms`, ``copies`` and ``compensations`` likewise. Within
    one list every row has the same keys. ``outbox``: the messages that carry the copies,
    one fan-out per CM (or part of a sequence)."""

    cms: list[dict[str, Any]] = field(default_factory=list)
    copies: list[dict[str, Any]] = field(default_factory=list)
    compensations: list[dict[str, Any]] = field(default_factory=list)
    outbox: list[Fanout] = field(default_factory=list)

    def extend(self, other: SendRows) -> None:
        """Add ``other``'s rows after these (one batch, written in one transaction)."""
        self.cms.extend(other.cms)
        self.copies.extend(other.copies)
        self.compensations.extend(other.compensations)
        self.outbox.extend(other.outbox)

    def cm_ids(self) -> list[str]:
        """The ids of the CMs, in the order they were added."""
        return [row["cm_id"] for row in self.cms]

    def queues(self) -> list[str]:
        """The destination queues the copies go to (exchanges' copies aside), sorted."""
        return sorted({row["routing_key"] for row in self.copies if not row["exchange"]})

    def by_table(self) -> tuple[tuple[sa.Table, list[dict[str, Any]]], ...]:
        """Each table with its rows, CMs first (the others refer to them)."""
        return (
            (tables.cms, self.cms),
            (tables.copies, self.copies),
            (tables.compensations, self.compensations),
        )


class SendStore(Protocol):
    """Writes and reads a sender's CM rows, in the caller's transaction or in one of
    their own."""

    def add(self, session: Session | Connection, rows: SendRows) -> None:
        """Insert ``rows``, the outbox's too, in the caller's transaction; never commits.
        A CM id or copy message id already stored raises
        :class:`sqlalchemy.exc.IntegrityError` (the caller's transaction is then failed)."""

    def add_committed(self, engine: Engine, rows: SendRows) -> None:
        """Insert ``rows`` as :meth:`add` does, in a transaction of their own, committed
        on return (nothing is written if it raises)."""

    def cm(self, bind: Session | Connection, cm_id: str) -> sa.Row[Any] | None:
        """The CM row of ``cm_id`` (every column of the table), or None if there is none."""


class SqlAlchemySendStore:
    """:class:`SendStore` on SQLAlchemy Core: an executemany per table, on any database."""

    def add(self, session: Session | Connection, rows: SendRows) -> None:
        for table, values in rows.by_table():
            if values:
                session.execute(sa.insert(table), values)
        enqueue_fanouts(session, rows.outbox)

    def add_committed(self, engine: Engine, rows: SendRows) -> None:
        with Session(engine) as session, session.begin():
            self.add(session, rows)

    def cm(self, bind: Session | Connection, cm_id: str) -> sa.Row[Any] | None:
        return bind.execute(sa.select(tables.cms).where(tables.cms.c.cm_id == cm_id)).first()


class PsycopgSendStore(SqlAlchemySendStore):
    """:class:`SendStore` for PostgreSQL through psycopg 3: one statement for the three
    tables and the outbox, its rows bound as one array per column (as a plain row when a
    table gets one)."""

    def add(self, session: Session | Connection, rows: SendRows) -> None:
        _execute(backends.psycopg_connection(session), rows)

    def add_committed(self, engine: Engine, rows: SendRows) -> None:
        # One statement is all or nothing on its own: sent in autocommit, it is the whole
        # transaction, without the round trips of a BEGIN and a COMMIT.
        with engine.connect() as conn:
            raw = backends.psycopg_connection(conn)
            try:
                raw.autocommit = True
            except psycopg.Error as exc:  # a connection found broken: the error a send raises
                raise pg.wrapped("SET autocommit", {}, exc) from exc
            try:
                _execute(raw, rows)
            finally:
                if not raw.closed:  # a broken connection is dropped by the pool instead
                    raw.autocommit = False


def _execute(raw: psycopg.Connection[Any], rows: SendRows) -> None:
    """Send ``rows`` (the outbox's too) as one statement on ``raw``."""
    parts = tuple((table, values) for table, values in rows.by_table() if values)
    outbox = fanouts_statement(rows.outbox)
    if not parts and outbox is None:
        return
    shape = tuple((table, tuple(values[0]), len(values) == 1) for table, values in parts)
    params: dict[str, Any] = {}
    for (table, columns, one), (_, values) in zip(shape, parts, strict=True):
        for name, column, as_json in _binds(table, columns):
            if one:
                value = values[0][column]
                params[name] = _json_text(value) if as_json else value
            else:
                array = [row[column] for row in values]
                params[name] = [_json_text(v) for v in array] if as_json else array
    tail = ""
    if outbox is not None:
        # The outbox's parameters are named after its columns, ours table.column.
        tail, outbox_params = outbox
        params |= outbox_params
    pg.execute(raw, _insert(shape, tail), params)


@functools.lru_cache(maxsize=64)
def _binds(table: sa.Table, columns: tuple[str, ...]) -> tuple[tuple[str, str, bool], ...]:
    """Per column: its parameter's name, the column, and whether it holds JSON (bound as
    JSON text, which the statement casts)."""
    return tuple((_param(table, c), c, isinstance(table.c[c].type, sa.JSON)) for c in columns)


def _json_text(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


@functools.lru_cache(maxsize=64)
def _insert(shape: tuple[tuple[sa.Table, tuple[str, ...], bool], ...], tail: str) -> str:
    """The one statement that inserts the rows of every table of ``shape`` (each table
    with the columns given, and whether it gets one row), then runs ``tail`` (the outbox's
    INSERT, if any): all but the last as data-modifying ``WITH`` queries, which PostgreSQL
    runs to completion whether or not anything reads them. The foreign keys of the copies
    and compensations are checked at the end of the statement, when the CMs are in."""
    inserts = [_table_insert(table, columns, one) for table, columns, one in shape]
    if tail:
        inserts.append(tail)
    if len(inserts) == 1:
        return inserts[0]
    with_ = ", ".join(f"w{i} AS ({sql})" for i, sql in enumerate(inserts[:-1]))
    return f"WITH {with_} {inserts[-1]}"


def _table_insert(table: sa.Table, columns: tuple[str, ...], one: bool) -> str:
    """One row of values (``one``), else a row per element of the column arrays (bound
    in binary: see :mod:`condmsg.infra.fastpaths.pg`)."""
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
