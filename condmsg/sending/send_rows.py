"""The rows a send writes: the port a :class:`~condmsg.sending.sender.Sender` writes them
through, and its adapters.

A send writes three kinds of rows in one transaction: the CM, one copy per destination and
one compensation per destination. :class:`SqlAlchemySendStore` inserts them with SQLAlchemy
Core on any database; :class:`PsycopgSendStore` sends each table's rows to PostgreSQL as
one ``unnest`` statement with binary array parameters (see :mod:`outbox.pg`), so a batch
of CMs costs one round trip per table however many it holds. The sender picks one adapter
when it is built; ``tests/contract/test_send_store.py`` holds both to the same rows.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg
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

    def batch(self, session: Session) -> contextlib.AbstractContextManager[None]:
        """A block whose writes (:meth:`add`'s and the outbox's) may reach the database
        together, by the block's end at the latest; their errors are raised by then, as
        :meth:`add` raises them. Only statements that return nothing may run inside."""


class SqlAlchemySendStore:
    """:class:`SendStore` on SQLAlchemy Core: an executemany per table, on any database."""

    def add(self, session: Session, rows: SendRows) -> None:
        for table, values in rows.by_table():
            if values:
                session.execute(sa.insert(table), values)

    def cm(self, bind: Session | Connection, cm_id: str) -> sa.Row[Any] | None:
        return bind.execute(sa.select(tables.cms).where(tables.cms.c.cm_id == cm_id)).first()

    def batch(self, session: Session) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


class PsycopgSendStore(SqlAlchemySendStore):
    """:class:`SendStore` for PostgreSQL through psycopg 3: one statement per table."""

    def add(self, session: Session, rows: SendRows) -> None:
        raw = None
        for table, values in rows.by_table():
            if values:
                raw = raw or backends.psycopg_connection(session)
                columns = tuple(values[0])
                pg.execute(raw, _unnest_insert(table, columns), _arrays(table, columns, values))

    @contextlib.contextmanager
    def batch(self, session: Session) -> Iterator[None]:
        # psycopg's pipeline mode: the statements of the block (and the transaction's
        # BEGIN, if it has not begun yet) go out without waiting for each other's results,
        # and the block's end waits once for all of them. A send's four INSERTs then cost
        # the caller's transaction one round trip instead of four. Statements inside must
        # not need their results at once (SQLAlchemy reads a result's description and row
        # count as soon as it executes): the sphere's row is counted before the block.
        raw = backends.psycopg_connection(session)
        try:
            with raw.pipeline():
                yield
        except psycopg.Error as exc:
            raise pg.wrapped("(the INSERTs of a send)", {}, exc) from exc


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
def _unnest_insert(table: sa.Table, columns: tuple[str, ...]) -> str:
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    types = {c: str(table.c[c].type.compile(dialect=dialect)) for c in columns}
    return pg.unnest_insert(table.name, types)
