"""The receiver's store: the writes of its hot path, behind one port.

A read claims its RLOG row (or a notice's inbox row), a transactional read commits with its
COMMIT acks, a sequence part is kept until its sequence is complete. These are the
statements whose form depends on the database and its driver; :class:`ReceiverStore` names
them, and a receiver talks to its store only through it.

Two adapters implement it: :class:`SqlAlchemyReceiverStore` (SQLAlchemy Core, correct on
SQLite and on PostgreSQL) and ``PsycopgReceiverStore`` in
:mod:`ackd.receiver_store_psycopg` (the same behaviour on PostgreSQL through psycopg 3,
with the claim and the acks riding on the transaction's ``BEGIN`` and ``COMMIT``). A
``Receiver`` picks one when it is built (:func:`condmsg.infra.backends.pick`); the RLOG's
decisions (:mod:`ackd.rlog`) keep their plain statements, whose form is the same
everywhere.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from ackd.tables import rlog
from ackd.tables import sequence_parts as parts
from outbox.enqueueing import enqueue_all
from outbox.message import OutboxMessage

__all__ = ["ReceiverStore", "SqlAlchemyReceiverStore", "StoreTraits"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreTraits:
    """What a receiver's way of working depends on in the database behind its store.

    ``row_locks``: writers run side by side and a transaction holds the rows it wrote
    until it ends (PostgreSQL), so a decision that delivers nothing must not keep its row
    locked for the length of an app's transaction. False where one write transaction
    runs at a time (SQLite): nothing waits on a row there.

    ``keep_connection``: a database server, where handing a connection back to the pool
    costs a round trip (its reset is a ``ROLLBACK``); a receiver keeps one connection per
    reading thread instead.
    """

    row_locks: bool
    keep_connection: bool


class ReceiverStore(Protocol):
    """The receiver's writes whose form depends on the database. Methods run in the
    caller's session and never commit, unless their name says so."""

    def attach(self, engine: Engine) -> StoreTraits:
        """Serve ``engine`` from now on (called once, by the receiver that owns it)."""
        ...

    def claim_original(self, session: Session, row: Mapping[str, Any]) -> bool:
        """Insert an original's ``consumed`` RLOG row unless one with its key exists;
        True if this call inserted it (this transaction then holds it). A conflict
        writes and locks nothing; on PostgreSQL it first waits for a concurrent
        transaction inserting the same key to end."""
        ...

    def claim(self, session: Session, table: sa.Table, row: Mapping[str, Any]) -> bool:
        """The same claim in ``table`` (a compensation's RLOG row, a notice's inbox row)."""
        ...

    def limit_lock_wait(self, session: Session, timeout_ms: int) -> None:
        """From now until the transaction ends, fail a wait for a row lock after
        ``timeout_ms`` milliseconds (where the database has such waits)."""
        ...

    def commit_with_acks(self, session: Session, acks: Sequence[OutboxMessage]) -> None:
        """Add ``acks`` to the outbox and commit the session: the app's pending writes,
        its RLOG rows and the acks commit together, or nothing does."""
        ...

    def store_part(self, session: Session, row: Mapping[str, Any]) -> None:
        """Keep one sequence part (a redelivered part is ignored)."""
        ...


class SqlAlchemyReceiverStore:
    """:class:`ReceiverStore` in SQLAlchemy Core, for SQLite and PostgreSQL alike. Stateless:
    each method takes its dialect from the session's connection."""

    def attach(self, engine: Engine) -> StoreTraits:
        server = _is_postgresql(engine)
        return StoreTraits(row_locks=server, keep_connection=server)

    def claim_original(self, session: Session, row: Mapping[str, Any]) -> bool:
        return self.claim(session, rlog, row)

    def claim(self, session: Session, table: sa.Table, row: Mapping[str, Any]) -> bool:
        # Core on the session's connection, no ORM bookkeeping: this runs on every read.
        conn = session.connection()
        return conn.execute(_insert_new(conn.dialect.name, table), row).first() is not None

    def limit_lock_wait(self, session: Session, timeout_ms: int) -> None:
        if _is_postgresql(session.get_bind()):
            session.execute(sa.text(f"SET LOCAL lock_timeout = '{int(timeout_ms)}ms'"))

    def commit_with_acks(self, session: Session, acks: Sequence[OutboxMessage]) -> None:
        enqueue_all(session, acks)
        session.commit()

    def store_part(self, session: Session, row: Mapping[str, Any]) -> None:
        insert = _dialect_module(session.get_bind().dialect.name).insert
        session.execute(insert(parts).values(**row).on_conflict_do_nothing())


def _is_postgresql(bind: Engine | Connection) -> bool:
    return bind.dialect.name == "postgresql"


def _dialect_module(dialect: str) -> Any:
    """The dialect whose ``insert`` has ``ON CONFLICT`` (SQLite's form serves any other)."""
    return postgresql if dialect == "postgresql" else sqlite


@functools.cache
def _insert_new(dialect: str, table: sa.Table) -> Any:
    """``INSERT ... ON CONFLICT DO NOTHING RETURNING``, built once per dialect and table
    (the values come with each execution, so SQLAlchemy's compiled cache is hit every
    time)."""
    return (
        _dialect_module(dialect)
        .insert(table)
        .on_conflict_do_nothing(index_elements=list(table.primary_key.columns))
        # RETURNING says reliably whether this statement inserted; rowcount does not on
        # every driver for ON CONFLICT DO NOTHING.
        .returning(table.c.cm_id)
    )
